"""A torch.compile'd forward around a Triton softmax kernel: dynamo compiles the glue (contiguity, allocation)
and the launch runs as is (torch.compiler.disable keeps dynamo from tracing into the launcher, which it cannot
do under the Triton interpreter). The kernel does all the work; whether torch.compile is allowed is the
deck's rule to set.

Problem: demo/row_softmax
Verdict: clean
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_2d(x_ptr, y_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, BLOCK)[None, :]
    ok = (r < n_rows) & (c < n_cols)
    v = tl.load(x_ptr + r * n_cols + c, mask=ok, other=-float("inf"))
    e = tl.exp(v - tl.max(v, axis=1)[:, None])
    e = tl.where(ok, e, 0.0)
    tl.store(y_ptr + r * n_cols + c, e / tl.sum(e, axis=1)[:, None], mask=ok)


@torch.compiler.disable
def _launch(x: torch.Tensor, y: torch.Tensor) -> None:
    rows, cols = x.shape
    _softmax_2d[(triton.cdiv(rows, 4),)](x, y, rows, cols, ROWS=4, BLOCK=triton.next_power_of_2(cols))


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._compiled = torch.compile(self._forward, dynamic=True)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        _launch(x, y)
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._compiled(x)
