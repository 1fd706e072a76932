import torch
import torch.nn as nn

class ModelNew(nn.Module):
    """Normalizes by the running statistics, as BatchNorm does in eval mode."""

    def __init__(self, num_features):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features)

    def forward(self, x):
        return nn.functional.batch_norm(x, self.bn.running_mean, self.bn.running_var, self.bn.weight, self.bn.bias, training=False)
