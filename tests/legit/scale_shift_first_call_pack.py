"""Scale-and-shift whose weight and bias are interleaved into one (cols, 2) buffer on the first call, so the
kernel reads one pair per column. The parameters are loaded after construction, hence the packing at the first
call; a call counter says which call is the first. Every call runs the same kernel on the packed pairs.

Problem: demo/scale_shift
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _affine_pairs(x_ptr, wb_ptr, y_ptr, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    ok = (rows[:, None] < n_rows) & col_ok[None, :]
    scale = tl.load(wb_ptr + 2 * cols, mask=col_ok, other=0.0)
    shift = tl.load(wb_ptr + 2 * cols + 1, mask=col_ok, other=0.0)
    at = rows[:, None] * n_cols + cols[None, :]
    tl.store(y_ptr + at, tl.load(x_ptr + at, mask=ok, other=0.0) * scale[None, :] + shift[None, :], mask=ok)


class ModelNew(torch.nn.Module):
    def __init__(self, cols: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 1:
            self.pairs = torch.stack([self.weight.detach(), self.bias.detach()], dim=1).contiguous()
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        _affine_pairs[(triton.cdiv(rows, 16),)](x, self.pairs, y, rows, cols, BLOCK_R=16, BLOCK_C=triton.next_power_of_2(cols))
        return y
