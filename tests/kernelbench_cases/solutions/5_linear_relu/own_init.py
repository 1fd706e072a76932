import torch
import torch.nn as nn

class ModelNew(nn.Module):
    """Its own initialization: other weights than the seeded reference's."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) * 0.1)
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x):
        return torch.relu(x @ self.weight.t() + self.bias)
