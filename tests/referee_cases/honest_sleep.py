"""Correct and honest, at a fixed cost a call: 10 ms of host time, then the reference's arithmetic."""
import time

import torch

class ModelNew(torch.nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))

    def forward(self, x):
        time.sleep(0.01)
        return x * self.weight + self.bias
