"""Scale-and-shift over 2-D tiles whose sizes ``triton.autotune`` picks among several configurations, per column
count (the autotuner times each on the first call of a new key and keeps the fastest). Off GPUs, where Triton has
no benchmarker, the autotuner times each configuration by the host clock.

Problem: demo/scale_shift
"""
import time

import torch
import triton
import triton.language as tl


def _bench(kernel_call, quantiles):
    """Triton's benchmark on GPUs; one host-timed call elsewhere (the CPU interpreter has no benchmarker)."""
    if torch.cuda.is_available():
        return triton.testing.do_bench(kernel_call, quantiles=quantiles)
    start = time.perf_counter()
    kernel_call()
    return [(time.perf_counter() - start) * 1e3] * len(quantiles)


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_R": 8, "BLOCK_C": 64}, num_warps=2),
        triton.Config({"BLOCK_R": 16, "BLOCK_C": 128}, num_warps=4),
        triton.Config({"BLOCK_R": 32, "BLOCK_C": 64}, num_warps=4),
        triton.Config({"BLOCK_R": 4, "BLOCK_C": 256}, num_warps=8),
    ],
    key=["n_cols"],
    do_bench=_bench,
)
@triton.jit
def _affine_tiles(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    ok = (rows[:, None] < n_rows) & col_ok[None, :]
    at = rows[:, None] * n_cols + cols[None, :]
    scale = tl.load(w_ptr + cols, mask=col_ok, other=0.0)
    shift = tl.load(b_ptr + cols, mask=col_ok, other=0.0)
    tl.store(y_ptr + at, tl.load(x_ptr + at, mask=ok, other=0.0) * scale[None, :] + shift[None, :], mask=ok)


class ModelNew(torch.nn.Module):
    def __init__(self, cols: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        grid = lambda meta: (triton.cdiv(rows, meta["BLOCK_R"]), triton.cdiv(cols, meta["BLOCK_C"]))  # noqa: E731
        _affine_tiles[grid](x, self.weight, self.bias, y, rows, cols)
        return y
