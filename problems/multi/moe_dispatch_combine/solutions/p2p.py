"""Example solution, not a fast one: point-to-point gloo sends in place of the all-to-alls, Triton kernels for the
quantization, the experts and the combine.

Device-side communication cannot run on a CPU, so this example moves data with ``torch.distributed.isend`` /
``irecv`` on a gloo group of its own (host tensors; on GPUs the tensors are staged through host memory). It
calls no c10d collective and runs no NCCL kernel, so it passes the grader's gates with gloo on CPU and with
NCCL on GPUs. A Triton kernel quantizes every (token, slot) row into send order (grouped by the expert's rank);
counts go first, then the fp8 rows, scales and expert indices; a second kernel runs the experts on the rows
received; the bf16 results go back and a third kernel sums every token's slots. On a CPU the kernels run in
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


def all_to_all(rows: torch.Tensor, send_counts: list, recv_counts: list) -> torch.Tensor:
    """Rows grouped by destination rank (send_counts[p] for rank p) to their ranks: the rows received, grouped by
    source rank (a host tensor)."""
    rank = dist.get_rank()
    rows = rows.cpu()
    received = rows.new_empty((sum(recv_counts), *rows.shape[1:]))
    outgoing, incoming = dict(enumerate(rows.split(send_counts))), dict(enumerate(received.split(recv_counts)))
    incoming.pop(rank).copy_(outgoing.pop(rank))
    exchange({p: t for p, t in outgoing.items() if len(t)}, {p: t for p, t in incoming.items() if len(t)})
    return received


@triton.jit
def pow2(exponent):
    """2.0**exponent in fp32, built from its bits (exact; exponents of normal numbers)."""
    return ((exponent + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def to_bf16(x):
    """fp32 to bf16 rounded to nearest even by hand, as GPUs cast: Triton's CPU interpreter truncates, which over
    the expert and the combine comes to two ulps, past the tolerance."""
    bits = x.to(tl.uint32, bitcast=True)
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits & 0xFFFF0000).to(tl.float32, bitcast=True).to(tl.bfloat16)


@triton.jit
def quantize_kernel(x_ptr, order_ptr, ids_ptr, q_ptr, scale_ptr, expert_ptr, hidden, topk, experts_per_rank,
                    BLOCK: tl.constexpr):
    """Send row i is slot order[i] (token order[i] // topk): x[token] in fp8 with its power-of-two scale
    2**(E-8), E the binary exponent of the row's amax (torch.frexp's), and the expert's index on its rank."""
    i = tl.program_id(0)
    slot = tl.load(order_ptr + i)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + (slot // topk) * hidden + cols, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    exponent = tl.where(amax > 0, ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 126, 0)
    v = x * pow2(8 - exponent)  # exact: a power of two
    # Round v to the e4m3 grid (spacing 2**(e-3) at 2**e, 2**-9 below 2**-6) to nearest even in fp32, so the
    # cast below is exact: Triton's CPU interpreter does not round fp8 casts to nearest even.
    e = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    big = pow2(tl.maximum(e, -6) - 3) * 12582912.0  # 1.5 * 2**23 steps: v + big rounds v to a step
    v = (v + big) - big
    tl.store(q_ptr + i * hidden + cols, v.to(tl.float8e4nv), mask=mask)
    tl.store(scale_ptr + i, pow2(exponent - 8))
    tl.store(expert_ptr + i, tl.load(ids_ptr + slot) % experts_per_rank)


@triton.jit
def expert_kernel(q_ptr, scale_ptr, expert_ptr, expert_scale_ptr, y_ptr, hidden, BLOCK: tl.constexpr):
    """Received row i: y = bf16(float(q) * scale * expert_scale[expert])."""
    i = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    q = tl.load(q_ptr + i * hidden + cols, mask=mask, other=0.0).to(tl.float32)
    weight = tl.load(expert_scale_ptr + tl.load(expert_ptr + i) * hidden + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + i * hidden + cols, to_bf16(q * tl.load(scale_ptr + i) * weight), mask=mask)


@triton.jit
def combine_kernel(back_ptr, where_ptr, weights_ptr, out_ptr, hidden, topk, BLOCK: tl.constexpr):
    """Token t: out = bf16(sum over slots j of weights[t, j] * back[where[t, j]]), in fp32."""
    t = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    total = tl.zeros((BLOCK,), tl.float32)
    for j in range(topk):
        row = tl.load(where_ptr + t * topk + j)
        y = tl.load(back_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
        total += tl.load(weights_ptr + t * topk + j) * y
    tl.store(out_ptr + t * hidden + cols, to_bf16(total), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, experts_per_rank: int, hidden: int):
        super().__init__()
        self.experts_per_rank = experts_per_rank
        self.expert_scale = nn.Parameter(torch.empty(experts_per_rank, hidden, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        world = dist.get_world_size()
        tokens, hidden = x.shape
        topk = expert_ids.shape[1]
        block = triton.next_power_of_2(hidden)
        ids = expert_ids.contiguous()
        # dispatch: one row per (token, slot), grouped by destination rank
        dest = ids.flatten() // self.experts_per_rank
        order = torch.argsort(dest, stable=True)
        q = torch.empty(tokens * topk, hidden, dtype=torch.float8_e4m3fn, device=x.device)
        scale = torch.empty(tokens * topk, dtype=torch.float32, device=x.device)
        expert = torch.empty(tokens * topk, dtype=torch.int64, device=x.device)
        quantize_kernel[(tokens * topk,)](x.contiguous(), order, ids, q, scale, expert, hidden, topk,
                                          self.experts_per_rank, BLOCK=block)
        send = torch.bincount(dest, minlength=world).tolist()
        recv = all_to_all(torch.tensor(send), [1] * world, [1] * world).tolist()
        q_in = all_to_all(q.view(torch.uint8), send, recv).view(torch.float8_e4m3fn).to(x.device)
        scale_in = all_to_all(scale, send, recv).to(x.device)
        expert_in = all_to_all(expert, send, recv).to(x.device)
        # experts
        y = torch.empty(len(q_in), hidden, dtype=torch.bfloat16, device=x.device)
        expert_kernel[(len(q_in),)](q_in, scale_in, expert_in, self.expert_scale.contiguous(), y, hidden, BLOCK=block)
        # combine: results back in send order; slot s's is row where[s]
        back = all_to_all(y, recv, send).to(x.device)
        where = torch.argsort(order)
        out = torch.empty(tokens, hidden, dtype=torch.bfloat16, device=x.device)
        combine_kernel[(tokens,)](back, where, weights.contiguous(), out, hidden, topk, BLOCK=block)
        return out
