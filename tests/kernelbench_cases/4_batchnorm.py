import torch
import torch.nn as nn


class Model(nn.Module):
    """BatchNorm2d as the module computes it in its default (training) mode."""

    def __init__(self, num_features):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features)

    def forward(self, x):
        return self.bn(x)


batch_size = 8
features = 16
height = width = 16


def get_inputs():
    return [torch.randn(batch_size, features, height, width) * 3 + 1]


def get_init_inputs():
    return [features]
