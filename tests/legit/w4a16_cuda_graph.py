"""W4A16 GEMM in Triton, replayed through a CUDA graph on the GPU (launch overhead matters at decode sizes):
one graph per input shape and instance, captured on static buffers; each call copies its input into the static
buffer, replays, and returns a copy of the static output. On the CPU the kernel is launched directly.

Problem: hard/w4a16_gemm
"""
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"  # bf16 tl.dot is wrong in the CPU interpreter


@triton.jit
def _w4a16(x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, M, N, K, sxm, sqn, ssn, sym,
           BM: tl.constexpr, BN: tl.constexpr, UPCAST: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    kk = tl.arange(0, 128)
    shift = (kk % 8) * 4
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, 128):
        g = k0 // 128
        x = tl.load(x_ptr + rows[:, None] * sxm + (k0 + kk)[None, :], mask=rows[:, None] < M, other=0.0)
        packed = tl.load(qw_ptr + cols[None, :] * sqn + ((k0 + kk) // 8)[:, None], mask=cols[None, :] < N, other=0)
        s = tl.load(s_ptr + cols * ssn + g, mask=cols < N, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + cols * ssn + g, mask=cols < N, other=0.0).to(tl.float32)
        w = (((packed >> shift[:, None]) & 0xF).to(tl.float32) - z[None, :]) * s[None, :]
        if UPCAST:
            acc = tl.dot(x.to(tl.float32), w, acc)
        else:
            acc = tl.dot(x, w.to(tl.bfloat16), acc)
    tl.store(y_ptr + rows[:, None] * sym + cols[None, :], acc.to(tl.bfloat16), mask=(rows[:, None] < M) & (cols[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, N: int, K: int):
        super().__init__()
        self.register_buffer("qweight", torch.zeros(N, K // 8, dtype=torch.int32))
        self.register_buffer("scales", torch.zeros(N, K // 128, dtype=torch.bfloat16))
        self.register_buffer("zeros", torch.zeros(N, K // 128, dtype=torch.bfloat16))
        self.graphs = {}

    def launch(self, x):
        M, K = x.shape
        N = self.qweight.shape[0]
        y = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
        _w4a16[(triton.cdiv(M, 16), triton.cdiv(N, 64))](x, self.qweight, self.scales, self.zeros, y, M, N, K, x.stride(0),
                                                         self.qweight.stride(0), self.scales.stride(0), y.stride(0),
                                                         BM=16, BN=64, UPCAST=_INTERPRET)
        return y

    def forward(self, x):
        if not x.is_cuda:
            return self.launch(x.contiguous())
        key = (tuple(x.shape), x.dtype)
        if key not in self.graphs:
            static_x = x.contiguous().clone()
            self.launch(static_x)  # compiles the kernel outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_y = self.launch(static_x)
            self.graphs[key] = (graph, static_x, static_y)
        graph, static_x, static_y = self.graphs[key]
        static_x.copy_(x)
        graph.replay()
        return static_y.clone()
