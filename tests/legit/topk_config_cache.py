"""Selection top-k in Triton with a module-level cache of launch configurations keyed on (n, k): a cache of
configurations, not of outputs. The kernel is the exploits' genuine one.

Problem: hard/topk
Stage: ../exploits/_topk_kernels.py
"""
import torch
import torch.nn as nn
import triton

from _topk_kernels import _topk

_CONFIGS = {}


def config(n: int, k: int):
    if (n, k) not in _CONFIGS:
        block = min(4096, triton.next_power_of_2(n))
        _CONFIGS[(n, k)] = {"BLOCK": block, "num_warps": 8 if block >= 2048 else 4}
    return _CONFIGS[(n, k)]


class ModelNew(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x):
        x = x.contiguous()
        batch, n = x.shape
        values = torch.empty(batch, self.k, dtype=torch.float32, device=x.device)
        indices = torch.empty(batch, self.k, dtype=torch.int64, device=x.device)
        _topk[(batch,)](x, values, indices, n, self.k, x.stride(0), values.stride(0), **config(n, self.k))
        return values, indices
