"""Scale-and-shift writing into a ring of three output buffers per shape, each allocated with ``torch.empty`` the
first time its turn comes (triple buffering, as a serving stack keeps its activations): an output stays valid until
the third call after it. Every call writes its whole output with its own kernel; no call reads memory it did not
write first.

Problem: demo/scale_shift
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _scale_shift_flat(x_ptr, w_ptr, b_ptr, y_ptr, total, n_cols, BLOCK: tl.constexpr):
    pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = pos < total
    col = pos % n_cols
    y = tl.load(x_ptr + pos, mask=live) * tl.load(w_ptr + col, mask=live) + tl.load(b_ptr + col, mask=live)
    tl.store(y_ptr + pos, y, mask=live)


class ModelNew(torch.nn.Module):
    RING = 3

    def __init__(self, cols: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))
        self._rings = {}

    def _buffer(self, x: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), x.dtype, x.device)
        ring = self._rings.setdefault(key, {"buffers": [None] * self.RING, "turn": 0})
        turn = ring["turn"]
        ring["turn"] = (turn + 1) % self.RING
        if ring["buffers"][turn] is None:
            ring["buffers"][turn] = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        return ring["buffers"][turn]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = self._buffer(x)
        total = x.numel()
        _scale_shift_flat[(triton.cdiv(total, 1024),)](x, self.weight, self.bias, y, total, x.shape[1], BLOCK=1024)
        return y
