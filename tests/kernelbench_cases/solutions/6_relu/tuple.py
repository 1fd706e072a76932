import torch
import torch.nn as nn

class ModelNew(nn.Module):
    """Right values in a one-element tuple."""

    def forward(self, x):
        return (torch.relu(x),)
