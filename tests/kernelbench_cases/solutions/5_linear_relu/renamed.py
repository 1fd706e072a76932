import torch
import torch.nn as nn

class ModelNew(nn.Module):
    """The same layer under another name: same seed, same weights; strict load_state_dict would refuse it."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.clamp_min(x @ self.proj.weight.t() + self.proj.bias, 0.0)
