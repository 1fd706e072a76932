"""Row softmax as a dispatcher op of its own namespace defined with a raw ``torch.library.Library`` and ``impl`` (not
``custom_op``): the op's Python body launches the solution's Triton kernel. The recorder cannot run such a body
under its mode; the op launched the solution's kernels, so it is the solution's work, and the profiler sees what
torch ops its body runs (an empty output).

Problem: demo/row_softmax
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_row(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    live = offs < n_cols
    v = tl.load(x_ptr + row * stride + offs, mask=live, other=-float("inf"))
    e = tl.exp(v - tl.max(v, axis=0))
    tl.store(y_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=live)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    _softmax_row[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


_LIB = torch.library.Library("rowlib", "DEF")
_LIB.define("row_normalize(Tensor x) -> Tensor")
_LIB.impl("row_normalize", _softmax, "CompositeExplicitAutograd")


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.rowlib.row_normalize(x)
