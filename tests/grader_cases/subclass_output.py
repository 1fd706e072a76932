import torch


class Lazy(torch.Tensor):
    pass


class ModelNew(torch.nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))

    def forward(self, x):
        return (x * self.weight + self.bias).as_subclass(Lazy)
