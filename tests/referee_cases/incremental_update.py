"""Keeps the last call's input and output; when the next input differs from it in under 5% of its elements (calls
that are the same problem but for a few perturbed elements), it updates the rows that changed at a tenth of the
cost (1 ms of host time, not 10): exact outputs, a fraction of the work. Timed calls must each be a new problem."""
import time

import torch

from _demo_kernels import scale_shift


class ModelNew(torch.nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))
        self.seen = None

    def forward(self, x):
        if self.seen is not None and self.seen[0].shape == x.shape:
            differs = self.seen[0] != x
            if 0 < int(differs.sum()) and differs.float().mean() < 0.05:
                time.sleep(0.001)
                out = self.seen[1].clone()
                rows = differs.any(dim=-1)
                out[rows] = scale_shift(x[rows], self.weight, self.bias)
                self.seen = (x.clone(), out)
                return out.clone()
        time.sleep(0.01)
        out = scale_shift(x, self.weight, self.bias)
        self.seen = (x.clone(), out)
        return out
