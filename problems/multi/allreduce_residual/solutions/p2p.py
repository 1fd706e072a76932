"""Example solution, not a fast one: point-to-point gloo sends in place of the all-reduce, a Triton kernel for the sum.

Device-side communication cannot run on a CPU, so this example moves data with ``torch.distributed.isend`` /
``irecv`` on a gloo group of its own (host tensors; on GPUs the tensors are staged through host memory). It
calls no c10d collective and runs no NCCL kernel, so it passes the grader's gates with gloo on CPU and with
NCCL on GPUs. Every rank sends its ``x`` to every other rank; one Triton kernel (Triton's interpreter on a CPU)
sums all of them in rank order in fp32 and adds the residual.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import triton
import triton.language as tl

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


@triton.jit
def sum_residual_kernel(parts_ptr, residual_ptr, out_ptr, n, world, BLOCK: tl.constexpr):
    """out = (parts[0] + ... + parts[world-1]) + residual over n elements, in fp32, rounded to bf16 once."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in range(world):
        total += tl.load(parts_ptr + r * n + offsets, mask=mask).to(tl.float32)
    total += tl.load(residual_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, total.to(tl.bfloat16), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        rank, world = dist.get_rank(), dist.get_world_size()
        parts = torch.empty((world, *x.shape), dtype=x.dtype)  # every rank's x, received in place (host)
        parts[rank] = x
        exchange({peer: parts[rank] for peer in range(world) if peer != rank},
                 {peer: parts[peer] for peer in range(world) if peer != rank})
        parts = parts.to(x.device)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        n, block = x.numel(), 1024
        sum_residual_kernel[(triton.cdiv(n, block),)](parts, residual.contiguous(), out, n, world, BLOCK=block)
        return out
