import torch
import torch.nn as nn

class ModelNew(nn.Module):
    """Normalizes by the batch statistics, as BatchNorm does in training mode."""

    def __init__(self, num_features):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))

    def forward(self, x):
        mean = x.mean(dim=(0, 2, 3), keepdim=True)
        var = x.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)
