import torch
import torch.nn as nn

class ModelNew(nn.Module):
    """Right values in float64."""

    def forward(self, x):
        return torch.relu(x).double()
