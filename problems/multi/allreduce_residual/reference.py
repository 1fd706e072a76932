"""All-reduce with a residual add: the epilogue of a tensor-parallel output projection.

On every rank r of a world of n GPUs (one process per GPU, torch.distributed already initialized):

    out_r = (x_0 + x_1 + ... + x_{n-1}) + residual_r

* ``x``        (tokens, hidden) bfloat16: this rank's partial sum
* ``residual`` (tokens, hidden) bfloat16: this rank's residual stream
* ``out``      (tokens, hidden) bfloat16

The sum over ranks is NCCL's all-reduce in bfloat16. Every rank has its own inputs and checks its own output.
"""
import torch
import torch.distributed as dist
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        total = x.clone()
        dist.all_reduce(total)
        return total + residual


def get_init_inputs(shape: dict) -> list:
    return []


def get_inputs(shape: dict, device: torch.device) -> list:
    # The grader seeds torch's RNG differently on every rank, so every rank draws different tensors.
    size = (shape["tokens"], shape["hidden"])
    x = torch.randn(size, device=device, dtype=torch.bfloat16)
    residual = torch.randn(size, device=device, dtype=torch.bfloat16)
    return [x, residual]
