import torch


class ModelNew(torch.nn.Module):
    """A correct scale-and-shift whose every instance keeps a 256 MiB workspace (touched), as a solution that packs
    its weights or plans its scratch once per model does: a grade builds a model per shape, seed and stage."""

    def __init__(self, cols):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))
        self.workspace = torch.ones(256 * 2**20 // 4)

    def forward(self, x):
        return x * self.weight + self.bias
