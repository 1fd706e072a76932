"""Correct and honest, at a fixed cost a call: 10 ms of host time, then its own Triton kernel."""
import time

import torch

from _demo_kernels import scale_shift

class ModelNew(torch.nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))

    def forward(self, x):
        time.sleep(0.01)
        return scale_shift(x, self.weight, self.bias)
