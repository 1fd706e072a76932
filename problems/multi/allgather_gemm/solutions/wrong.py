"""Wrong on purpose: a rank-symmetric shortcut. It assumes every rank holds the same rows, so the all-gather
becomes this rank's rows repeated ``world`` times and no data moves. Exact at world size 1 only."""
import torch
import torch.distributed as dist
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, hidden: int, out_local: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_local, hidden, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(dist.get_world_size(), 1) @ self.weight.T
