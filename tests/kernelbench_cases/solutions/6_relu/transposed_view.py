import torch
import torch.nn as nn

class ModelNew(nn.Module):
    """Right values in a non-contiguous tensor."""

    def forward(self, x):
        return torch.relu(x.t().contiguous()).t()
