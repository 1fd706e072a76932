import torch
import torch.nn as nn

class ModelNew(nn.Module):
    """Right everywhere but the last row."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        out = torch.var(x, dim=self.dim)
        out[-1] = 0.0
        return out
