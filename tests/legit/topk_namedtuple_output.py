"""Top-k by selection in Triton that returns its two outputs as a ``collections.namedtuple`` (values, indices), as
torch's own ``topk`` returns a named tuple: a tuple subclass, read by the harness as the tuple it is.

Problem: hard/topk
"""
from collections import namedtuple

import torch
import triton
import triton.language as tl

TopK = namedtuple("TopK", ["values", "indices"])


@triton.jit
def _select(x_ptr, val_ptr, idx_ptr, n, k, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    prev_v = float("inf")
    prev_i = -1
    for i in range(0, k):
        best_v = -float("inf")
        best_i = n + BLOCK
        for start in range(0, n, BLOCK):
            idx = start + offs
            x = tl.load(x_ptr + row * stride_x + idx, mask=idx < n, other=-float("inf"))
            ok = (idx < n) & ((x < prev_v) | ((x == prev_v) & (idx > prev_i)))
            cand = tl.where(ok, x, -float("inf"))
            m = tl.max(cand, axis=0)
            m_idx = tl.min(tl.where(ok & (cand == m), idx, n + BLOCK), axis=0)
            better = (m > best_v) | ((m == best_v) & (m_idx < best_i))
            best_v = tl.where(better, m, best_v)
            best_i = tl.where(better, m_idx, best_i)
        tl.store(val_ptr + row * k + i, best_v)
        tl.store(idx_ptr + row * k + i, best_i.to(tl.int64))
        prev_v = best_v
        prev_i = best_i


class ModelNew(torch.nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> TopK:
        x = x.contiguous()
        rows, n = x.shape
        values = torch.empty(rows, self.k, dtype=torch.float32, device=x.device)
        indices = torch.empty(rows, self.k, dtype=torch.int64, device=x.device)
        _select[(rows,)](x, values, indices, n, self.k, x.stride(0), BLOCK=min(1024, triton.next_power_of_2(n)))
        return TopK(values, indices)
