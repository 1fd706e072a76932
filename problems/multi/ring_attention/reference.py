"""Ring attention for context parallelism: causal attention over a sequence split across ranks.

The sequence of ``world * seq_local`` tokens is cut into ``2 * world`` chunks of ``seq_local / 2`` tokens;
rank r holds chunks r and 2*world-1-r (the load-balanced "zigzag" layout: every rank then has the same
amount of causal work). On every rank r (one process per GPU, torch.distributed already initialized):

    out_r = softmax(q_r K^T / sqrt(head_dim) + causal mask) V

where K and V are every rank's keys and values and the mask lets a query at global position i see keys at
positions j <= i (``positions`` gives a rank's global positions).

* ``q``, ``k``, ``v`` (heads, seq_local, head_dim) bfloat16: this rank's tokens, in its local order
* ``out``            (heads, seq_local, head_dim) bfloat16, in the same order as ``q``

The reference gathers K and V with NCCL's all-gather and runs masked SDPA; a ring implementation passes
K/V blocks from rank to rank and overlaps each transfer with attention on the block at hand.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def positions(rank: int, world: int, seq_local: int, device: torch.device) -> torch.Tensor:
    """Global positions of rank ``rank``'s tokens: chunks rank and 2*world-1-rank of seq_local/2 tokens."""
    chunk = seq_local // 2
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    second = torch.arange((2 * world - 1 - rank) * chunk, (2 * world - rank) * chunk, device=device)
    return torch.cat([first, second])


class Model(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        world, rank = dist.get_world_size(), dist.get_rank()
        heads, seq_local, head_dim = k.shape
        gathered = k.new_empty(world * 2, heads, seq_local, head_dim)
        dist.all_gather_into_tensor(gathered, torch.stack([k, v]))
        k_all, v_all = gathered.view(world, 2, heads, seq_local, head_dim).unbind(1)
        k_all = k_all.transpose(0, 1).reshape(heads, world * seq_local, head_dim)
        v_all = v_all.transpose(0, 1).reshape(heads, world * seq_local, head_dim)
        key_pos = torch.cat([positions(r, world, seq_local, q.device) for r in range(world)])
        mask = key_pos[None, :] <= positions(rank, world, seq_local, q.device)[:, None]
        return F.scaled_dot_product_attention(q[None], k_all[None], v_all[None], attn_mask=mask)[0]


def get_init_inputs(shape: dict) -> list:
    return []


def get_inputs(shape: dict, device: torch.device) -> list:
    size = (shape["heads"], shape["seq_local"], shape["head_dim"])
    return [torch.randn(size, device=device, dtype=torch.bfloat16) for _ in range(3)]
