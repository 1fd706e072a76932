"""Example solution, not a fast one: a ring of point-to-point gloo sends in place of the all-gather.

Device-side communication cannot run on a CPU, so this example moves data with ``torch.distributed.isend`` /
``irecv`` on a gloo group of its own (host tensors; on GPUs the tensors are staged through host memory). It
calls no c10d collective and runs no NCCL kernel, so it passes the grader's gates with gloo on CPU and with
NCCL on GPUs. The K/V block travels around the ring (rank r sends to r+1 and receives from r-1); each step
attends to the block at hand and merges it into an fp32 online softmax.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

_GLOO = None


def exchange(outgoing: dict, incoming: dict) -> None:
    """Send ``outgoing[peer]`` and receive into ``incoming[peer]`` (host tensors); all posted before any wait."""
    global _GLOO
    if _GLOO is None:
        _GLOO = dist.new_group(backend="gloo")
    works = [dist.isend(t, peer, group=_GLOO) for peer, t in outgoing.items()]
    works += [dist.irecv(t, peer, group=_GLOO) for peer, t in incoming.items()]
    for work in works:
        work.wait()


def positions(rank: int, world: int, seq_local: int, device: torch.device) -> torch.Tensor:
    chunk = seq_local // 2
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    second = torch.arange((2 * world - 1 - rank) * chunk, (2 * world - rank) * chunk, device=device)
    return torch.cat([first, second])


class ModelNew(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rank, world = dist.get_rank(), dist.get_world_size()
        heads, seq_local, head_dim = q.shape
        query_pos = positions(rank, world, seq_local, q.device)
        qf = q.float() * head_dim**-0.5
        m = torch.full((heads, seq_local), -1e30, device=q.device)  # running max (finite: masked blocks stay 0)
        l = torch.zeros(heads, seq_local, device=q.device)
        acc = torch.zeros(heads, seq_local, head_dim, device=q.device)
        block = torch.stack([k, v]).cpu()
        for step in range(world):
            owner = (rank - step) % world
            kb, vb = block.to(q.device).float().unbind(0)
            allowed = positions(owner, world, seq_local, q.device)[None, :] <= query_pos[:, None]
            scores = (qf @ kb.transpose(1, 2)).masked_fill(~allowed, float("-inf"))
            m_new = torch.maximum(m, scores.amax(-1))
            p = torch.exp(scores - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + p @ vb
            m = m_new
            if step < world - 1:
                incoming = torch.empty_like(block)
                exchange({(rank + 1) % world: block}, {(rank - 1) % world: incoming})
                block = incoming
        return (acc / l[..., None]).to(q.dtype)
