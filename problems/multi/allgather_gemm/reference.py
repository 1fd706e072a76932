"""All-gather + GEMM: a column-parallel linear layer after sequence parallelism.

On every rank r of a world of n GPUs (one process per GPU, torch.distributed already initialized):

    full  = concat(x_0, x_1, ..., x_{n-1}) along tokens      (world * tokens, hidden)
    out_r = full @ W_r^T                                       (world * tokens, out_local)

* ``x``      (tokens, hidden) bfloat16: this rank's slice of the sequence
* ``weight`` (out_local, hidden) bfloat16 parameter: this rank's column shard of the weight
* ``out``    (world * tokens, out_local) bfloat16, rows in rank order

The reference gathers with NCCL's all-gather, then runs one cuBLAS GEMM; a fast solution overlaps them
(each rank's rows can be multiplied as soon as they arrive).
"""
import torch
import torch.distributed as dist
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden: int, out_local: int):
        super().__init__()
        # Seeded per rank by the grader: every rank holds a different shard.
        self.weight = nn.Parameter(torch.randn(out_local, hidden, dtype=torch.bfloat16) / hidden**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        full = x.new_empty(dist.get_world_size() * x.shape[0], x.shape[1])
        dist.all_gather_into_tensor(full, x)
        return full @ self.weight.T


def get_init_inputs(shape: dict) -> list:
    return [shape["hidden"], shape["out_local"]]


def get_inputs(shape: dict, device: torch.device) -> list:
    return [torch.randn(shape["tokens"], shape["hidden"], device=device, dtype=torch.bfloat16)]
