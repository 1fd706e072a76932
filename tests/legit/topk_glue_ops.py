"""Top-k by selection in Triton (k passes over each row), around it torch glue of the kinds a wrapper keeps: the row
cast and made contiguous, padded to a whole number of blocks with -inf through F.pad, the picks written as int32 and widened
to int64, the values sliced out of a wider buffer. The profiler sees each of these ops, some of them composite; none
computes the selection.

Problem: hard/topk
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _select(x_ptr, val_ptr, idx_ptr, width, k, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    prev_v = float("inf")
    prev_i = -1
    for i in range(0, k):
        best_v = -float("inf")
        best_i = width
        for start in range(0, width, BLOCK):
            idx = start + offs
            x = tl.load(x_ptr + row * width + idx)
            after = (x < prev_v) | ((x == prev_v) & (idx > prev_i))
            cand = tl.where(after, x, -float("inf"))
            m = tl.max(cand, axis=0)
            m_idx = tl.min(tl.where(after & (cand == m), idx, width), axis=0)
            better = (m > best_v) | ((m == best_v) & (m_idx < best_i))
            best_v = tl.where(better, m, best_v)
            best_i = tl.where(better, m_idx, best_i)
        tl.store(val_ptr + row * stride_o + i, best_v)
        tl.store(idx_ptr + row * k + i, best_i.to(tl.int32))
        prev_v = best_v
        prev_i = best_i


class ModelNew(torch.nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor):
        rows, n = x.shape
        block = min(1024, triton.next_power_of_2(n))
        width = triton.cdiv(n, block) * block
        padded = F.pad(x.to(torch.float32).contiguous(), (0, width - n), value=-float("inf"))
        values = torch.empty(rows, self.k + 1, dtype=torch.float32, device=x.device)
        picks = torch.empty(rows, self.k, dtype=torch.int32, device=x.device)
        _select[(rows,)](padded, values, picks, width, self.k, values.stride(0), BLOCK=block)
        return values[:, : self.k].contiguous(), picks.to(torch.int64)
