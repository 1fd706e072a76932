"""Example solution, not a fast one: point-to-point gloo sends in place of the all-reduce, Triton kernels for the
partial product and the sum.

Device-side communication cannot run on a CPU, so this example moves data with ``torch.distributed.isend`` /
``irecv`` on a gloo group of its own (host tensors; on GPUs the tensors are staged through host memory). It
calls no c10d collective and runs no NCCL kernel, so it passes the grader's gates with gloo on CPU and with
NCCL on GPUs. Every rank computes its bf16 partial product with a tiled Triton GEMM and sends it to every
other rank; a second Triton kernel sums the partials in rank order in fp32. On a CPU the kernels run in
Triton's interpreter.
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
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """c = a @ b^T for contiguous a (M, K), b (N, K) and c (M, N), bf16 with fp32 accumulation; one c tile each."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        a = tl.load(a_ptr + rows[:, None] * K + k[None, :], mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + cols[None, :] * K + k[:, None], mask=(cols[None, :] < N) & (k[:, None] < K), other=0.0)
        # fp32 operands: Triton's CPU interpreter gets bf16 tl.dot wrong; on GPUs bf16 is exact in tf32
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(tl.bfloat16),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def sum_kernel(parts_ptr, out_ptr, n, world, BLOCK: tl.constexpr):
    """out = parts[0] + ... + parts[world-1] over n elements, in fp32, rounded to bf16 once."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in range(world):
        total += tl.load(parts_ptr + r * n + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, total.to(tl.bfloat16), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, k_local: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden, k_local, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rank, world = dist.get_rank(), dist.get_world_size()
        (tokens, k_local), hidden = x.shape, self.weight.shape[0]
        partial = torch.empty(tokens, hidden, dtype=torch.bfloat16, device=x.device)
        grid = (triton.cdiv(tokens, 64), triton.cdiv(hidden, 64))
        matmul_kernel[grid](x.contiguous(), self.weight.contiguous(), partial, tokens, hidden, k_local,
                            BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
        parts = torch.empty((world, tokens, hidden), dtype=torch.bfloat16)  # every rank's partial (host)
        parts[rank] = partial
        exchange({peer: parts[rank] for peer in range(world) if peer != rank},
                 {peer: parts[peer] for peer in range(world) if peer != rank})
        parts = parts.to(x.device)
        out = torch.empty_like(partial)
        n, block = partial.numel(), 1024
        sum_kernel[(triton.cdiv(n, block),)](parts, out, n, world, BLOCK=block)
        return out
