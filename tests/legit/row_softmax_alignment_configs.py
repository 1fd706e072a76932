"""Row softmax whose launch configuration is cached per (columns, alignment of the input's and output's
pointers): aligned rows get ``tl.multiple_of`` hints so loads vectorise, and the configurations are computed
once per key. The key holds pointer alignment (``data_ptr() % 16``), never the pointers themselves.

Problem: demo/row_softmax
"""
import torch
import triton
import triton.language as tl

_LAUNCH = {}


@triton.jit
def _softmax_rows(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    start = row * stride
    if ALIGNED:
        start = tl.multiple_of(start, 4)
    live = offs < n_cols
    v = tl.load(x_ptr + start + offs, mask=live, other=-float("inf"))
    e = tl.exp(v - tl.max(v, axis=0))
    tl.store(y_ptr + start + offs, e / tl.sum(e, axis=0), mask=live)


def launch_config(n_cols: int, x: torch.Tensor, y: torch.Tensor) -> dict:
    key = (n_cols, x.stride(0), x.data_ptr() % 16, y.data_ptr() % 16)
    if key not in _LAUNCH:
        block = triton.next_power_of_2(n_cols)
        aligned = key[2] == 0 and key[3] == 0 and x.stride(0) % 4 == 0
        _LAUNCH[key] = {"BLOCK": block, "ALIGNED": aligned, "num_warps": 8 if block >= 2048 else 4}
    return _LAUNCH[key]


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        _softmax_rows[(x.shape[0],)](x, y, x.shape[1], x.stride(0), **launch_config(x.shape[1], x, y))
        return y
