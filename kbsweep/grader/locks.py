"""Machine-wide GPU locks: every grade holds its GPU(s) exclusively, across cells and sweeps on the same box.

A GPU's lock is an ``flock`` on ``$KBSWEEP_LOCK_DIR/gpu-<uuid>.lock`` (default ``<tmp>/kbsweep-locks``), keyed by
the device's UUID, so two sweeps that number GPUs differently still exclude each other, and a holder that dies,
however it dies, releases it.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator, List

from kbsweep.config import gpus
from kbsweep.errors import KbsweepError

POLL_S = 0.2


def lock_dir() -> Path:
    return Path(os.environ.get("KBSWEEP_LOCK_DIR") or Path(tempfile.gettempdir()) / "kbsweep-locks")


def try_take(pool: List[dict], count: int) -> List[tuple]:
    """Lock the first ``count`` free GPUs of ``pool`` without waiting: [(gpu, open lock file)], or [] if too few are free."""
    folder = lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    held: List[tuple] = []
    for gpu in pool:
        handle: IO = open(folder / f"gpu-{gpu['uuid'].replace('/', '_')}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        held.append((gpu, handle))
        if len(held) == count:
            return held
    for _, handle in held:
        handle.close()
    return []


@contextmanager
def device_lock(device: str, count: int = 1) -> Iterator[List[str]]:
    """Hold ``count`` GPUs exclusively and pin ``CUDA_VISIBLE_DEVICES`` to them for the block; yields their entries.

    The GPUs come from this process's pool (:func:`kbsweep.config.gpus.visible_gpus`: what CUDA_VISIBLE_DEVICES names,
    else every GPU NVML sees); the first ``count`` free ones are taken together, waiting while fewer are free.
    A process spawned inside the block (the grade) sees only them. On ``device != "cuda"``: no lock, yields [].
    """
    if device != "cuda":
        yield []
        return
    pool = gpus.visible_gpus()
    if count > len(pool):
        raise KbsweepError(
            f"a grade needs {count} GPU(s) but this process may use {len(pool)} ({[g['visible'] for g in pool]})"
        )
    held = try_take(pool, count)
    while not held:
        time.sleep(POLL_S)
        held = try_take(pool, count)
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu["visible"] for gpu, _ in held)
    try:
        yield [gpu["visible"] for gpu, _ in held]
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
        for _, handle in held:
            handle.close()


@contextmanager
def exclusive(name: str) -> Iterator[None]:
    """Hold the machine-wide lock ``name`` for the block, waiting while another process holds it (``kbsweep
    regrade``: one regrade per GPU model at a time, beside the per-grade GPU lock)."""
    folder = lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name.replace('/', '_')}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
