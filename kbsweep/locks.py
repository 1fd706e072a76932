"""Machine-wide device locks: every grade on a GPU holds it exclusively, across sweeps on the same box."""
from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

LOCK_DIR = Path(os.environ.get("KBSWEEP_LOCK_DIR", Path(tempfile.gettempdir()) / "kbsweep-locks"))


@contextmanager
def device_lock(device: str) -> Iterator[None]:
    """Hold the GPU this process sees (first of CUDA_VISIBLE_DEVICES) exclusively; no lock on CPU."""
    if device != "cuda":
        yield
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_DIR / f"gpu-{visible}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
