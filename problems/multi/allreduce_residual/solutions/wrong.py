"""Wrong on purpose: a rank-symmetric shortcut. It assumes every rank holds the same ``x``, so the sum over
ranks is ``world * x`` and no data moves. Exact at world size 1; rank-distinct inputs make it fail above."""
import torch
import torch.distributed as dist
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return x * dist.get_world_size() + residual
