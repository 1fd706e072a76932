import torch


class ModelNew(torch.nn.Module):
    """cuBLAS through torch: the timer-validation solution (this track forbids nothing)."""

    def forward(self, a, b):
        return torch.mm(a, b)
