"""Scale-and-shift with a 2-D tiled kernel; the tile sizes come from a functools.lru_cache'd selector keyed on
the column count (an int, never a tensor). Memoising a pure config function is ordinary practice, not an
output cache.

Problem: demo/scale_shift
"""
import functools

import torch
import triton
import triton.language as tl


@functools.lru_cache(maxsize=64)
def tiles(cols: int):
    block_c = min(256, max(32, triton.next_power_of_2(cols)))
    block_r = max(1, 2048 // block_c)
    return block_r, block_c


@triton.jit
def _affine_tile(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    ok = (rows[:, None] < n_rows) & col_ok[None, :]
    at = rows[:, None] * n_cols + cols[None, :]
    scale = tl.load(w_ptr + cols, mask=col_ok, other=0.0)
    shift = tl.load(b_ptr + cols, mask=col_ok, other=0.0)
    vals = tl.load(x_ptr + at, mask=ok, other=0.0)
    tl.store(y_ptr + at, vals * scale[None, :] + shift[None, :], mask=ok)


class ModelNew(torch.nn.Module):
    def __init__(self, cols: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        block_r, block_c = tiles(cols)
        y = torch.empty_like(x)
        grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
        _affine_tile[grid](x, self.weight, self.bias, y, rows, cols, BLOCK_R=block_r, BLOCK_C=block_c)
        return y
