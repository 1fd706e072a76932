"""Rebinds the runner's batch command to report every call five times longer than it ran: a figure the referee's
clock never saw (a process that claims more time than elapsed is reporting something other than its calls)."""
import gc
import time

import torch

from _demo_kernels import scale_shift

_runner = next(type(o) for o in gc.get_objects() if type(o).__name__ == "Runner")  # the harness, reached from inside
_batch = _runner.op_batch


def op_batch(self, message, fds):
    reply = _batch(self, message, fds)
    reply["ms"] = [m * 5 for m in reply.get("ms", [])]
    return reply


_runner.op_batch = op_batch


class ModelNew(torch.nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))

    def forward(self, x):
        time.sleep(0.01)
        return scale_shift(x, self.weight, self.bias)
