"""Scale-and-shift as a ``torch.library.triton_op``: the kernel is launched through ``wrap_triton``, which lets
torch.compile trace into the Triton kernel instead of treating the op as opaque.

Problem: demo/scale_shift
"""
import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


@triton.jit
def _affine(x_ptr, w_ptr, b_ptr, y_ptr, total, n_cols, BLOCK: tl.constexpr):
    pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = pos < total
    col = pos % n_cols
    y = tl.load(x_ptr + pos, mask=live) * tl.load(w_ptr + col, mask=live) + tl.load(b_ptr + col, mask=live)
    tl.store(y_ptr + pos, y, mask=live)


@triton_op("affine::scale_shift", mutates_args={})
def scale_shift(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    total = x.numel()
    wrap_triton(_affine)[(triton.cdiv(total, 1024),)](x, weight, bias, y, total, x.shape[1], BLOCK=1024)
    return y


class ModelNew(torch.nn.Module):
    def __init__(self, cols: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scale_shift(x.contiguous(), self.weight, self.bias)
