"""Row softmax with two strategies picked through an Enum, launch plans as a typing.NamedTuple and a
collections.namedtuple, and annotations from typing: one tile per row when the row fits, otherwise a looped
online-softmax kernel (running max and rescaled sum, then a normalising pass). Plain Python typing machinery.

Problem: demo/row_softmax
"""
import enum
from collections import namedtuple
from typing import NamedTuple, Tuple

import torch
import triton
import triton.language as tl

Grid = namedtuple("Grid", ["programs"])


class Strategy(enum.Enum):
    ONE_TILE = enum.auto()
    LOOPED = enum.auto()


class Plan(NamedTuple):
    strategy: Strategy
    block: int
    grid: Grid


@triton.jit
def _one_tile(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    start = tl.program_id(0) * n
    idx = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + start + idx, mask=idx < n, other=-float("inf"))
    p = tl.exp(v - tl.max(v, axis=0))
    tl.store(y_ptr + start + idx, p / tl.sum(p, axis=0), mask=idx < n)


@triton.jit
def _looped(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    start = tl.program_id(0) * n
    idx = tl.arange(0, BLOCK)
    run_max = tl.full([BLOCK], -float("inf"), tl.float32)
    run_sum = tl.zeros([BLOCK], tl.float32)
    for off in range(0, n, BLOCK):
        v = tl.load(x_ptr + start + off + idx, mask=off + idx < n, other=-float("inf"))
        new_max = tl.maximum(run_max, v)
        safe = tl.where(new_max == -float("inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - safe) + tl.exp(v - safe)
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    row_sum = tl.sum(run_sum * tl.exp(run_max - row_max), axis=0)
    for off in range(0, n, BLOCK):
        v = tl.load(x_ptr + start + off + idx, mask=off + idx < n, other=-float("inf"))
        tl.store(y_ptr + start + off + idx, tl.exp(v - row_max) / row_sum, mask=off + idx < n)


def plan_for(shape: Tuple[int, int], tile_limit: int = 256) -> Plan:
    rows, cols = shape
    if cols <= tile_limit:
        return Plan(Strategy.ONE_TILE, triton.next_power_of_2(cols), Grid(rows))
    return Plan(Strategy.LOOPED, 128, Grid(rows))


class ModelNew(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        plan = plan_for(tuple(x.shape))
        kernel = _one_tile if plan.strategy is Strategy.ONE_TILE else _looped
        kernel[(plan.grid.programs,)](x, y, x.shape[1], BLOCK=plan.block)
        return y
