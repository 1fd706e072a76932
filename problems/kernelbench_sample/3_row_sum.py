import torch
import torch.nn as nn


class Model(nn.Module):
    """Sum over the last dimension."""

    def __init__(self, dim):
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x):
        return torch.sum(x, dim=self.dim)


batch_size = 8
features = 300


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [-1]
