"""y = x * weight + bias, broadcast over rows (a memory-bound warm-up problem)."""
import torch


class Model(torch.nn.Module):
    def __init__(self, cols: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(cols))
        self.bias = torch.nn.Parameter(torch.randn(cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.bias


def get_init_inputs(shape):
    return [shape["cols"]]


def get_inputs(shape, device):
    return [torch.randn(shape["rows"], shape["cols"], device=device)]
