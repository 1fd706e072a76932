import torch
import torch.nn as nn

class ModelNew(nn.Module):
    """Multiplies in half precision: about 1e-3 relative error."""

    def forward(self, A, B):
        return (A.half() @ B.half()).float()
