"""What a sandboxed process tree uses, as its :class:`~kbsweep.sandbox.watch.Watch` measures it: memory (the resident
sizes as a cheap upper bound, the proportional set sizes as the exact figure) and disk (its writable folders and
the files its output goes to)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable, List


def rss_mib(pids: Iterable[int]) -> float:
    """The processes' resident sizes summed (shared pages once per process): never below :func:`pss_mib`, and
    read from ``statm`` without the page-table walk of ``smaps_rollup`` (~12 ms for a process holding torch)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total * os.sysconf("SC_PAGE_SIZE") / 2**20


def pss_mib(pids: Iterable[int]) -> float:
    """Memory the processes hold together: the sum of their proportional set sizes (a page shared by n of them
    counts 1/n in each), so a fork's copy-on-write pages are not counted once per process; a process whose
    smaps cannot be read counts its resident size."""
    total_kib = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                total_kib += next(int(line.split()[1]) for line in fh if line.startswith("Pss:"))
        except (OSError, StopIteration, IndexError, ValueError):
            try:
                with open(f"/proc/{pid}/statm") as fh:
                    total_kib += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
            except (OSError, IndexError, ValueError):
                pass
    return total_kib / 1024


def used_mib(folders: Iterable[Path], files: Iterable[str] = ()) -> float:
    """Disk blocks under ``folders`` and of ``files``."""
    total = 0
    paths = [
        os.path.join(root, name) for folder in folders for root, dirs, names in os.walk(folder) for name in dirs + names
    ]
    for path in [*paths, *files]:
        try:
            total += os.stat(path, follow_symlinks=path in files).st_blocks * 512
        except OSError:
            pass
    return total / 2**20


def output_files(pid: int) -> List[str]:
    """Where a process's stdout and stderr go, when those are files (its logs count against its disk quota)."""
    found = []
    for fd in (1, 2):
        link = f"/proc/{pid}/fd/{fd}"
        try:
            if stat.S_ISREG(os.stat(link).st_mode):
                found.append(link)
        except OSError:
            pass
    return found
