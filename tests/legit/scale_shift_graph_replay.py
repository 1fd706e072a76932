"""Scale-shift whose Triton launch is captured once per input shape in a CUDA graph and replayed (the launch
overhead a decode-sized call pays goes away): the graph reads a static input buffer the call copies into and
writes a static output the call returns a copy of. On the CPU the kernel is launched directly.

Problem: demo/scale_shift
"""
import torch
import triton
import triton.language as tl


@triton.jit
def scale_shift_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n, cols, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    col = offsets % cols
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, x * tl.load(w_ptr + col, mask=mask) + tl.load(b_ptr + col, mask=mask), mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, cols: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))
        self.graphs = {}

    def launch(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        block = 4096
        scale_shift_kernel[(triton.cdiv(x.numel(), block),)](x, self.weight, self.bias, y, x.numel(), x.shape[1], BLOCK=block)
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return self.launch(x.contiguous(), torch.empty_like(x))
        key = tuple(x.shape)
        if key not in self.graphs:
            static_x, static_y = x.contiguous().clone(), torch.empty_like(x)
            self.launch(static_x, static_y)  # compiled outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.launch(static_x, static_y)
            self.graphs[key] = (graph, static_x, static_y)
        graph, static_x, static_y = self.graphs[key]
        static_x.copy_(x)
        graph.replay()
        return static_y.clone()
