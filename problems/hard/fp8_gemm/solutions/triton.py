"""Plain tiled Triton GEMM: fp8 x fp8 tensor-core dot per K block, promoted into a float32 accumulator,
row/column scales in the epilogue."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _fp8_gemm_kernel(
    x_ptr, w_ptr, xs_ptr, ws_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        k_ok = kk < K
        a = tl.load(x_ptr + rows[:, None] * stride_xm + kk[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)          # (BM, BK) fp8
        b = tl.load(w_ptr + cols[None, :] * stride_wn + kk[:, None],
                    mask=col_ok[None, :] & k_ok[:, None], other=0.0)          # (BK, BN) fp8
        # Each K block's fp8 product is summed into the float32 accumulator outside the tensor
        # core: Hopper's fp8 MMA keeps a narrower accumulator, and over thousands of K it drifts.
        acc += tl.dot(a, b)

    xs = tl.load(xs_ptr + rows, mask=row_ok, other=0.0)
    ws = tl.load(ws_ptr + cols, mask=col_ok, other=0.0)
    y = acc * xs[:, None] * ws[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(tl.bfloat16),
             mask=row_ok[:, None] & col_ok[None, :])


class ModelNew(nn.Module):
    def __init__(self, N: int, K: int):
        super().__init__()
        self.N, self.K = N, K
        self.register_buffer("w", torch.zeros(N, K, dtype=torch.float8_e4m3fn))
        self.register_buffer("w_scale", torch.ones(N, dtype=torch.float32))

    def forward(self, x: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w = self.w.contiguous()
        M, K = x.shape
        N = w.shape[0]
        xs = x_scale.reshape(M).contiguous().float()
        ws = self.w_scale.contiguous().float()
        y = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
        BM, BN, BK = 64, 64, 64
        grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
        _fp8_gemm_kernel[grid](x, w, xs, ws, y, M, N, K,
                               x.stride(0), w.stride(0), y.stride(0),
                               BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, num_warps=4)
        return y
