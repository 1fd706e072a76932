"""A fast fp8 GEMM in Triton: grouped (L2-friendly) tile order, 128x128x64 tiles with a 3-stage pipeline on the
GPU, fp8 tensor-core dot with fp32 accumulation, row/column scales fused in the epilogue.

Problem: hard/fp8_gemm
"""
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
TILES = (32, 32, 32, 1) if _INTERPRET else (128, 128, 64, 3)  # BM, BN, BK, stages (the interpreter is slow)


@triton.jit
def _fp8_gemm_grouped(x_ptr, w_ptr, xs_ptr, ws_ptr, y_ptr, M, N, K, sxm, swn, sym,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + ks
        a = tl.load(x_ptr + rows[:, None] * sxm + kk[None, :], mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(w_ptr + cols[None, :] * swn + kk[:, None], mask=(cols[None, :] < N) & (kk[:, None] < K), other=0.0)
        acc += tl.dot(a, b)  # promoted per K block: Hopper's fp8 MMA accumulator is narrower than fp32
    xs = tl.load(xs_ptr + rows, mask=rows < M, other=0.0)
    ws = tl.load(ws_ptr + cols, mask=cols < N, other=0.0)
    y = acc * xs[:, None] * ws[None, :]
    tl.store(y_ptr + rows[:, None] * sym + cols[None, :], y.to(tl.bfloat16), mask=(rows[:, None] < M) & (cols[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, N: int, K: int):
        super().__init__()
        self.register_buffer("w", torch.zeros(N, K, dtype=torch.float8_e4m3fn))
        self.register_buffer("w_scale", torch.ones(N, dtype=torch.float32))

    def forward(self, x, x_scale):
        x = x.contiguous()
        M, K = x.shape
        N = self.w.shape[0]
        BM, BN, BK, stages = TILES
        y = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
        grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
        _fp8_gemm_grouped[grid](x, self.w, x_scale.reshape(M).float(), self.w_scale, y, M, N, K,
                                x.stride(0), self.w.stride(0), y.stride(0), BM=BM, BN=BN, BK=BK, GROUP_M=8,
                                num_warps=8, num_stages=stages)
        return y
