"""A torchrun worker's start: the runner's ranks, the referee's ranks and the smoke check each begin with
:func:`init_distributed` (torch only, so the candidate's runner ranks import nothing of the orchestrator)."""

from __future__ import annotations

import os
from typing import Tuple


def init_distributed() -> Tuple[int, int, str]:
    """In a torchrun worker: join the process group (NCCL on CUDA, else gloo) and bind this rank's GPU.

    Returns (rank, world size, torch device string)."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        backend, device = "nccl", f"cuda:{local_rank}"
    else:
        backend, device = "gloo", "cpu"
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), device
