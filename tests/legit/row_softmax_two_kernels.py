"""Row softmax with two kernels of its own, taken in turn call by call: one program per row holding the whole row,
and an online kernel that streams it in blocks (the kind of A/B a solution keeps while it compares two paths).
Every call launches one of them and computes nothing in torch; the output is a fresh ``torch.empty`` each call.

Problem: demo/row_softmax
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _whole_row(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    live = offs < n_cols
    v = tl.load(x_ptr + row * stride + offs, mask=live, other=-float("inf"))
    e = tl.exp(v - tl.max(v, axis=0))
    tl.store(y_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=live)


@triton.jit
def _streamed(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    high = -float("inf")
    total = 0.0
    for start in range(0, n_cols, BLOCK):
        v = tl.load(x_ptr + row * stride + start + offs, mask=start + offs < n_cols, other=-float("inf"))
        new_high = tl.maximum(high, tl.max(v, axis=0))
        total = total * tl.exp(high - new_high) + tl.sum(tl.exp(v - new_high), axis=0)
        high = new_high
    for start in range(0, n_cols, BLOCK):
        live = start + offs < n_cols
        v = tl.load(x_ptr + row * stride + start + offs, mask=live, other=-float("inf"))
        tl.store(y_ptr + row * stride + start + offs, tl.exp(v - high) / total, mask=live)


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.turn = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        self.turn ^= 1
        if self.turn:
            _whole_row[(rows,)](x, y, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols))
        else:
            _streamed[(rows,)](x, y, cols, x.stride(0), BLOCK=min(256, triton.next_power_of_2(cols)))
        return y
