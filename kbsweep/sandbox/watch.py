"""The watch over a sandboxed process tree: its processes found from ``/proc``, its memory cap, the supervisor that
stops it past its wall time, memory or disk quota (:class:`Watch`), and its killing, whole tree and all."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from kbsweep.sandbox.usage import output_files, pss_mib, rss_mib, used_mib

POLL_S = 0.1
HOST_SHARE = 0.75  # of the host's memory, a grade's default cap: the orchestrator and the agent keep the rest
DISK_POLL_S = 0.5


def process_tree(pid: int) -> List[int]:
    """``pid`` and its descendants (a sandbox's orphans are reparented inside it, so they stay in the tree)."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except OSError:
            continue
    return tree


def host_memory_mib() -> float:
    """This host's memory, or less where a cgroup (a Slurm job's, a container's) limits this process."""
    with open("/proc/meminfo") as fh:
        total = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:")) / 1024
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            value = Path(limit).read_text().strip()
        except OSError:
            continue
        if value.isdigit():
            total = min(total, int(value) / 2**20)
    return total


def memory_cap_mib(configured: Optional[float]) -> float:
    """The memory cap of a sandbox: the configured one, else HOST_SHARE of the host's; never more than the host
    has (past it the kernel's OOM killer, not the watch, would end the process, and nobody could say why)."""
    host = host_memory_mib()
    return min(float(configured), host) if configured else HOST_SHARE * host


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def kill(proc: subprocess.Popen, settle_s: float = 10.0) -> None:
    """Kill the sandbox's process group and wait until its whole tree is gone (bubblewrap's --die-with-parent
    takes the namespace's processes down)."""
    tree = process_tree(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    deadline = time.monotonic() + settle_s
    while any(map(alive, tree)) and time.monotonic() < deadline:
        time.sleep(0.01)


class Watch:
    """Polls a sandboxed process: wall time, memory of its whole tree (:func:`pss_mib`), disk held by its
    writable folders and by the files its stdout and stderr go to."""

    def __init__(
        self,
        proc: subprocess.Popen,
        wall_s: float,
        memory_mib: Optional[float],
        disk_mib: float,
        folders: Sequence[Path],
    ):
        self.proc, self.wall_s, self.memory_mib, self.disk_mib, self.folders = (
            proc,
            wall_s,
            memory_mib,
            disk_mib,
            folders,
        )
        self.started = time.monotonic()
        self.outputs = output_files(proc.pid)
        self.disk_start = used_mib(folders, self.outputs)
        self.disk_checked = self.started

    def breach(self) -> Optional[Tuple[str, str]]:
        """("wall" | "memory" | "disk", message) once a limit is passed, else None."""
        now = time.monotonic()
        if now - self.started > self.wall_s:
            return "wall", f"stopped after {self.wall_s:.0f} s (wall-clock limit)"
        # the exact figure (PSS) only when the cheap upper bound (RSS) is over the cap: polled every 0.1 s, the PSS
        # walk alone took a third of a core beside a CPU grade on a 2-core host
        tree = process_tree(self.proc.pid) if self.memory_mib else []
        if self.memory_mib and rss_mib(tree) > self.memory_mib and pss_mib(tree) > self.memory_mib:
            return "memory", f"stopped: its processes held more than {self.memory_mib:.0f} MiB of memory"
        if self.folders and now - self.disk_checked > DISK_POLL_S:  # a quota for sandboxes with writable folders
            self.disk_checked = now
            used = used_mib(self.folders, self.outputs)
            if used > self.disk_mib and used > self.disk_start:
                return (
                    "disk",
                    f"stopped: the writable folders and its output hold {used:.0f} MiB, over the {self.disk_mib} MiB quota",
                )
        return None

    def wait(self) -> Optional[Tuple[str, str]]:
        """Until the process ends or passes a limit (then it is killed); returns the breach, if any."""
        while self.proc.poll() is None:
            found = self.breach()
            if found:
                kill(self.proc)
                return found
            time.sleep(POLL_S)
        return None


def head_tail(fh, limit: int) -> str:
    """The first and last ``limit // 2`` bytes of an open file (the whole file when it is short)."""
    size = fh.seek(0, os.SEEK_END)
    fh.seek(0)
    if size <= limit:
        return fh.read().decode(errors="replace")
    head = fh.read(limit // 2).decode(errors="replace")
    fh.seek(size - limit // 2)
    return f"{head}\n[... {size - limit} bytes cut ...]\n{fh.read().decode(errors='replace')}"
