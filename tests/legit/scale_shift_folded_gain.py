"""Scale-and-shift whose weight is the product of the loaded weight and a per-column gain kept beside it (1.0 until
a caller retunes it), folded in torch on every call: one multiply over a row's worth of columns, the only torch
compute, a few percent of a call's bytes on a small shape. The rows are its own kernel's.

Problem: demo/scale_shift
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _scale_shift_rows(x_ptr, w_ptr, b_ptr, y_ptr, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)[:, None]
    c = tl.arange(0, BC)[None, :]
    keep = (r < rows) & (c < cols)
    y = tl.load(x_ptr + r * cols + c, mask=keep) * tl.load(w_ptr + c, mask=c < cols) + tl.load(b_ptr + c, mask=c < cols)
    tl.store(y_ptr + r * cols + c, y, mask=keep)


class ModelNew(torch.nn.Module):
    def __init__(self, cols: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))
        self.register_buffer("gain", torch.ones(cols), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        weight = self.weight * self.gain
        y = torch.empty_like(x)
        _scale_shift_rows[(triton.cdiv(rows, 16),)](x, weight, self.bias, y, rows, cols, BR=16, BC=triton.next_power_of_2(cols))
        return y
