"""Example solution, not a fast one: point-to-point gloo sends in place of the all-to-alls.

Device-side communication cannot run on a CPU, so this example moves data with ``torch.distributed.isend`` /
``irecv`` on a gloo group of its own (host tensors; on GPUs the tensors are staged through host memory). It
calls no c10d collective and runs no NCCL kernel, so it passes the grader's gates with gloo on CPU and with
NCCL on GPUs. Counts go first, then the fp8 rows, scales and expert indices, then the bf16 results back.
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


def swap(rows: dict, counts: dict) -> dict:
    """rows[peer] goes to peer; returns what each peer sent here (counts[peer] rows), this rank's own kept."""
    rank = dist.get_rank()
    local = rows[rank]
    incoming = {p: local.new_empty((n, *local.shape[1:]), device="cpu") for p, n in counts.items() if p != rank and n}
    exchange({p: t.cpu() for p, t in rows.items() if p != rank and len(t)}, incoming)
    return {p: incoming[p].to(local.device) if p in incoming else local[:0] for p in counts} | {rank: local}


class ModelNew(nn.Module):
    def __init__(self, experts_per_rank: int, hidden: int):
        super().__init__()
        self.experts_per_rank = experts_per_rank
        self.expert_scale = nn.Parameter(torch.empty(experts_per_rank, hidden, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        rank, world = dist.get_rank(), dist.get_world_size()
        tokens, hidden = x.shape
        topk = expert_ids.shape[1]
        amax = x.float().abs().amax(dim=-1, keepdim=True)
        _, exponent = torch.frexp(amax)
        scale = torch.ldexp(torch.ones_like(amax), exponent - 8)
        q = (x.float() / scale).to(torch.float8_e4m3fn).view(torch.uint8)
        flat = expert_ids.flatten()
        slots = {p: (flat // self.experts_per_rank == p).nonzero().flatten() for p in range(world)}
        sent = {p: torch.tensor([len(s)]) for p, s in slots.items()}
        counts = {p: torch.empty(1, dtype=torch.long) for p in range(world) if p != rank}
        exchange({p: n for p, n in sent.items() if p != rank}, counts)
        counts = {p: int(n) for p, n in counts.items()} | {rank: len(slots[rank])}
        q_in = swap({p: q[s // topk] for p, s in slots.items()}, counts)
        scale_in = swap({p: scale[s // topk] for p, s in slots.items()}, counts)
        expert_in = swap({p: flat[s] % self.experts_per_rank for p, s in slots.items()}, counts)
        y = {
            p: (q_in[p].view(torch.float8_e4m3fn).float() * scale_in[p] * self.expert_scale[expert_in[p]].float()).to(torch.bfloat16)
            for p in range(world)
        }
        back = swap(y, {p: len(s) for p, s in slots.items()})
        results = x.new_empty(tokens * topk, hidden)
        for p, s in slots.items():
            results[s] = back[p]
        return (results.view(tokens, topk, hidden).float() * weights[..., None]).sum(1).to(torch.bfloat16)
