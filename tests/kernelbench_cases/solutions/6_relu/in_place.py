import torch
import torch.nn as nn

class ModelNew(nn.Module):
    """Writes the result into its input and returns it: the output aliases the input."""

    def forward(self, x):
        return x.clamp_min_(0.0)
