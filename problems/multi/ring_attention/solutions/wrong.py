"""Wrong on purpose: a rank-symmetric shortcut. It assumes every rank holds the same keys and values, so
each rank's K/V stand in for every rank's block (with the right causal positions) and no data moves.
Exact at world size 1 only."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def positions(rank: int, world: int, seq_local: int, device: torch.device) -> torch.Tensor:
    chunk = seq_local // 2
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    second = torch.arange((2 * world - 1 - rank) * chunk, (2 * world - rank) * chunk, device=device)
    return torch.cat([first, second])


class ModelNew(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rank, world = dist.get_rank(), dist.get_world_size()
        seq_local = q.shape[1]
        key_pos = torch.cat([positions(r, world, seq_local, q.device) for r in range(world)])
        mask = key_pos[None, :] <= positions(rank, world, seq_local, q.device)[:, None]
        k_all, v_all = k.repeat(1, world, 1), v.repeat(1, world, 1)
        return F.scaled_dot_product_attention(q[None], k_all[None], v_all[None], attn_mask=mask)[0]
