import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        centered = x - x.mean(dim=self.dim, keepdim=True)
        return (centered * centered).sum(dim=self.dim) / (x.shape[self.dim] - 1)
