import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.nn.functional.leaky_relu(x, 0.01)
