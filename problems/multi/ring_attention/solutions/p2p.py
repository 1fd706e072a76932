"""Example solution, not a fast one: a ring of point-to-point gloo sends in place of the all-gather, a Triton
kernel for the attention.

Device-side communication cannot run on a CPU, so this example moves data with ``torch.distributed.isend`` /
``irecv`` on a gloo group of its own (host tensors; on GPUs the tensors are staged through host memory). It
calls no c10d collective and runs no NCCL kernel, so it passes the grader's gates with gloo on CPU and with
NCCL on GPUs. The K/V block travels around the ring (rank r sends to r+1 and receives from r-1); at each step
a Triton kernel (Triton's interpreter on a CPU) attends to the block at hand and merges it into an fp32 online
softmax, kept in memory between steps.
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
def position(i, rank, world, chunk):
    """Global position of rank ``rank``'s local token i: its chunks are rank and 2*world-1-rank."""
    return tl.where(i < chunk, rank * chunk + i, (2 * world - 1 - rank) * chunk + i - chunk)


@triton.jit
def attend_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, acc_ptr, out_ptr, rank, owner, world, seq, dim, scale,
                  FIRST: tl.constexpr, LAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """One head's BLOCK_M queries (rank ``rank``'s) against every key of rank ``owner``'s block: the running max
    m, sum l and output acc (fp32) start fresh when FIRST, and LAST writes out = acc / l in bf16 instead."""
    head = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    row_ok, d_ok = rows < seq, d < dim
    tile = head * seq * dim + rows[:, None] * dim + d[None, :]
    state = head * seq + rows
    # fp32 operands: Triton's CPU interpreter gets bf16 tl.dot wrong
    q = tl.load(q_ptr + tile, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32) * scale
    query_pos = position(rows, rank, world, seq // 2)
    if FIRST:
        m = tl.full((BLOCK_M,), -1e30, tl.float32)  # finite: rows with every key masked so far get 0, not NaN
        l = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    else:
        m = tl.load(m_ptr + state, mask=row_ok, other=-1e30)
        l = tl.load(l_ptr + state, mask=row_ok, other=0.0)
        acc = tl.load(acc_ptr + tile, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    for n0 in range(0, seq, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        key_ok = keys < seq
        kv = head * seq * dim + keys[:, None] * dim + d[None, :]
        k = tl.load(k_ptr + kv, mask=key_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + kv, mask=key_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        allowed = key_ok[None, :] & (position(keys, owner, world, seq // 2)[None, :] <= query_pos[:, None])
        scores = tl.where(allowed, tl.dot(q, tl.trans(k)), float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    if LAST:
        tl.store(out_ptr + tile, (acc / l[:, None]).to(tl.bfloat16), mask=row_ok[:, None] & d_ok[None, :])
    else:
        tl.store(m_ptr + state, m, mask=row_ok)
        tl.store(l_ptr + state, l, mask=row_ok)
        tl.store(acc_ptr + tile, acc, mask=row_ok[:, None] & d_ok[None, :])


class ModelNew(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rank, world = dist.get_rank(), dist.get_world_size()
        heads, seq_local, head_dim = q.shape
        q = q.contiguous()
        out = torch.empty_like(q)
        # the online softmax's state between ring steps (unused at world size 1)
        m = torch.empty(heads, seq_local, device=q.device)
        l = torch.empty(heads, seq_local, device=q.device)
        acc = torch.empty(heads, seq_local, head_dim, device=q.device)
        block = torch.stack([k, v]).cpu()
        grid = (triton.cdiv(seq_local, 32), heads)
        block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot's dimensions are 16 at least
        for step in range(world):
            kb, vb = block.to(q.device).unbind(0)
            attend_kernel[grid](q, kb, vb, m, l, acc, out, rank, (rank - step) % world, world, seq_local, head_dim,
                                head_dim**-0.5, FIRST=step == 0, LAST=step == world - 1,
                                BLOCK_M=32, BLOCK_N=32, BLOCK_D=block_d)
            if step < world - 1:
                incoming = torch.empty_like(block)
                exchange({(rank + 1) % world: block}, {(rank - 1) % world: incoming})
                block = incoming
        return out
