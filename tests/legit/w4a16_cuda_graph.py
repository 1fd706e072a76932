"""W4A16 GEMM in Triton (the exploits' genuine kernel, staged), replayed through a CUDA graph on the GPU (launch
overhead matters at decode sizes): one graph per input shape and instance, captured on static buffers; each call
copies its input into the static buffer, replays, and returns a copy of the static output. On the CPU the kernel
is launched directly.

Problem: hard/w4a16_gemm
Stage: ../exploits/_w4a16_kernels.py, ../exploits/_packed_int4.py
"""
import torch

from _packed_int4 import PackedInt4
from _w4a16_kernels import w4a16_gemm


class ModelNew(PackedInt4):
    def __init__(self, N: int, K: int):
        super().__init__(N, K)
        self.graphs = {}

    def launch(self, x):
        return w4a16_gemm(x, self.qweight, self.scales, self.zeros)

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
