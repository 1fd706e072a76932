"""Deliberately wrong first attempt: stores each pick's position in the flattened input
(row * n + column) instead of its column, which is only right for the first row.

Selection top-k in Triton: one program per row, k passes over the row.

Pass i finds the largest element that comes after the (i-1)-th pick in the total order
"larger value first, then smaller index first", so ties are handled and indices stay unique.
Correct for any k <= n, but O(k*n) per row: simple, not fast.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _topk_select_kernel(x_ptr, val_ptr, idx_ptr, n, k, stride_x, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    offs = tl.arange(0, BLOCK)
    big = n + BLOCK  # larger than any valid index
    prev_v = float("inf")
    prev_i = -1
    for i in range(0, k):
        best_v = -float("inf")
        best_i = big
        for start in range(0, n, BLOCK):
            idx = start + offs
            in_row = idx < n
            x = tl.load(x_row + idx, mask=in_row, other=-float("inf"))
            # strictly after the previous pick in the (value desc, index asc) order
            after = (x < prev_v) | ((x == prev_v) & (idx > prev_i))
            ok = in_row & after
            cand = tl.where(ok, x, -float("inf"))
            m = tl.max(cand, axis=0)
            m_idx = tl.min(tl.where(ok & (cand == m), idx, big), axis=0)
            better = (m > best_v) | ((m == best_v) & (m_idx < best_i))
            best_v = tl.where(better, m, best_v)
            best_i = tl.where(better, m_idx, best_i)
        tl.store(val_ptr + row * stride_o + i, best_v)
        tl.store(idx_ptr + row * stride_o + i, (row * n + best_i).to(tl.int64))  # BUG: flat offset, not column
        prev_v = best_v
        prev_i = best_i


class ModelNew(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor):
        x = x.contiguous()
        batch, n = x.shape
        values = torch.empty(batch, self.k, dtype=torch.float32, device=x.device)
        indices = torch.empty(batch, self.k, dtype=torch.int64, device=x.device)
        BLOCK = min(4096, triton.next_power_of_2(n))
        _topk_select_kernel[(batch,)](x, values, indices, n, self.k, x.stride(0), values.stride(0),
                                      BLOCK=BLOCK, num_warps=8)
        return values, indices
