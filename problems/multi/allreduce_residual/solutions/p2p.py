"""Example solution, not a fast one: point-to-point gloo sends in place of the all-reduce.

Device-side communication cannot run on a CPU, so this example moves data with ``torch.distributed.isend`` /
``irecv`` on a gloo group of its own (host tensors; on GPUs the tensors are staged through host memory). It
calls no c10d collective and runs no NCCL kernel, so it passes the grader's gates with gloo on CPU and with
NCCL on GPUs. Every rank sends its ``x`` to every other rank and sums all of them in rank order in fp32.
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
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = x.cpu()
        parts = {peer: torch.empty_like(mine) for peer in range(world) if peer != rank}
        exchange({peer: mine for peer in parts}, parts)
        parts[rank] = mine
        total = sum(parts[peer].float() for peer in range(world))
        return (total.to(x.device) + residual.float()).to(x.dtype)
