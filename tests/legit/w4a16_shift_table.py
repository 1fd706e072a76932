"""W4A16 GEMM whose kernel unpacks the int4 codes with a table of nibble shifts: the table is a small constant
tensor, built once with ``torch.tensor`` on the first call (where the device is known) and kept on the
instance; every call runs the fused dequantise-and-multiply kernel.

Problem: hard/w4a16_gemm
Stage: ../exploits/_packed_int4.py
"""
import os

import torch
import triton
import triton.language as tl

from _packed_int4 import PackedInt4

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"  # bf16 tl.dot is wrong in the CPU interpreter


@triton.jit
def _w4a16_shifted(x_ptr, qw_ptr, s_ptr, z_ptr, shift_ptr, y_ptr, M, N, K, sqn, ssn,
                   BM: tl.constexpr, BN: tl.constexpr, UPCAST: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    kk = tl.arange(0, 128)
    shift = tl.load(shift_ptr + kk % 8)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, 128):
        x = tl.load(x_ptr + rows[:, None] * K + (k0 + kk)[None, :], mask=rows[:, None] < M, other=0.0)
        packed = tl.load(qw_ptr + cols[None, :] * sqn + ((k0 + kk) // 8)[:, None], mask=cols[None, :] < N, other=0)
        codes = (packed >> shift[:, None]) & 0xF
        s = tl.load(s_ptr + cols * ssn + k0 // 128, mask=cols < N, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + cols * ssn + k0 // 128, mask=cols < N, other=0.0).to(tl.float32)
        w = (codes.to(tl.float32) - z[None, :]) * s[None, :]
        if UPCAST:
            acc = tl.dot(x.to(tl.float32), w, acc)
        else:
            acc = tl.dot(x, w.to(tl.bfloat16), acc)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc.to(tl.bfloat16), mask=(rows[:, None] < M) & (cols[None, :] < N))


class ModelNew(PackedInt4):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(self, "_shifts", None) is None:
            self._shifts = torch.tensor([0, 4, 8, 12, 16, 20, 24, 28], dtype=torch.int32, device=x.device)
        x = x.contiguous()
        M, K = x.shape
        N = self.qweight.shape[0]
        y = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
        grid = (triton.cdiv(M, 16), triton.cdiv(N, 64))
        _w4a16_shifted[grid](x, self.qweight, self.scales, self.zeros, self._shifts, y, M, N, K, self.qweight.stride(0),
                             self.scales.stride(0), BM=16, BN=64, UPCAST=_INTERPRET)
        return y
