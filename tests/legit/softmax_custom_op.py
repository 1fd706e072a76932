"""Row softmax in Triton, registered as a torch library op (``torch.library.custom_op``) with a fake
implementation, so that torch.compile and export see one opaque op with known output metadata; the model calls it
through the dispatcher (``torch.ops.rowwise.softmax``). The op's body launches the solution's own kernel on every
call.

Problem: demo/row_softmax
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_rows(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    live = offs < n_cols
    v = tl.load(x_ptr + row * stride + offs, mask=live, other=-float("inf"))
    e = tl.exp(v - tl.max(v, axis=0))
    tl.store(y_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=live)


@torch.library.custom_op("rowwise::softmax", mutates_args=())
def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    _softmax_rows[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


@softmax_rows.register_fake
def _(x):
    return torch.empty_like(x)


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.rowwise.softmax(x)
