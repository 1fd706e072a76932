"""Row softmax over rows padded to a power-of-two width: torch pads each row with -inf (F.pad), a Triton kernel
normalises the padded rows without masks, and the result is cut back to the row's width and made contiguous.
The pad and the contiguous copy move about twice the problem's bytes around a kernel that does all the
arithmetic: data-movement glue, not library compute.

Problem: demo/row_softmax
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _softmax_padded(x_ptr, y_ptr, WIDTH: tl.constexpr):
    offs = tl.program_id(0) * WIDTH + tl.arange(0, WIDTH)
    v = tl.load(x_ptr + offs)
    e = tl.exp(v - tl.max(v, axis=0))
    tl.store(y_ptr + offs, e / tl.sum(e, axis=0))


class ModelNew(torch.nn.Module):
    def forward(self, x):
        rows, cols = x.shape
        width = triton.next_power_of_2(cols)
        padded = F.pad(x, (0, width - cols), value=float("-inf"))
        out = torch.empty_like(padded)
        _softmax_padded[(rows,)](padded, out, WIDTH=width)
        return out[:, :cols].contiguous()
