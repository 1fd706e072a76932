"""Example solution, not a fast one: point-to-point gloo sends in place of the all-gather.

Device-side communication cannot run on a CPU, so this example moves data with ``torch.distributed.isend`` /
``irecv`` on a gloo group of its own (host tensors; on GPUs the tensors are staged through host memory). It
calls no c10d collective and runs no NCCL kernel, so it passes the grader's gates with gloo on CPU and with
NCCL on GPUs. Every rank sends its rows to every other rank, then multiplies all rows in rank order.
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


class ModelNew(nn.Module):
    def __init__(self, hidden: int, out_local: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_local, hidden, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = x.cpu()
        rows = {peer: torch.empty_like(mine) for peer in range(world) if peer != rank}
        exchange({peer: mine for peer in rows}, rows)
        rows[rank] = mine
        full = torch.cat([rows[peer] for peer in range(world)]).to(x.device)
        return full @ self.weight.T
