"""The runner's CPU time, per thread, read by the referee from the host's ``/proc``: evidence the candidate's
interpreter cannot reach, rewrite or pause (docs/grading.md, "Work seen from outside the interpreter").

The supervisor, outside both sandboxes, opens the host's ``/proc`` as a directory and hands that descriptor to the
referee with the host pid at the root of the runner's process tree (bubblewrap's, or the zygote's child); the
runner never holds it. Before the candidate is imported the referee pins the *calling thread*: the main thread of
the process in that tree that has used the most CPU (the runner's interpreter, which has imported torch). Around
every timed batch and checked call it then reads every live thread of every process under the root, started by
anyone, from ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds on the CPU), and each process's own and reaped
children's ticks from ``stat``, which keep the time of threads and processes that exited meanwhile. CPU on any
thread but the calling one is work the in-process recorder and profiler may not see (a pool, a listener started
from a finalizer, a child process); :func:`finding` judges it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")
# Other threads' CPU an honest window may show, per timing mode: (share of its wall, floor in ms). On CPU grades the
# runner's torch and BLAS run one thread (grading_env), so honest windows read 0; on a GPU the profiler's and the
# driver's own threads work a little. Calibrated on honest grades (docs/grading.md, "Work seen from outside").
ALLOWANCE = {"host": (0.01, 0.25), "gpu": (0.05, 0.75)}


@dataclass(frozen=True)
class Reading:
    """One look: each live thread's CPU ns, and each process's ticks (its exited threads and reaped children included)."""

    threads: Dict[Tuple[int, int], int]
    ticks: Dict[int, int]


def read_at(proc_fd: int, path: str) -> str:
    fd = os.open(path, os.O_RDONLY, dir_fd=proc_fd)
    try:
        return os.read(fd, 1 << 16).decode(errors="replace")
    finally:
        os.close(fd)


def listing(proc_fd: int, path: str) -> List[str]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY, dir_fd=proc_fd)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


class RunnerCPU:
    """The runner tree's CPU as the host's ``/proc`` (``proc_fd``) shows it, from ``root`` down."""

    def __init__(self, proc_fd: int, root: int):
        self.proc_fd, self.root = proc_fd, root
        self.calling: Optional[Tuple[int, int]] = None  # (pid, tid) of the thread the harness calls the candidate on

    def processes(self) -> List[int]:
        """``root`` and its live descendants, through each thread's ``children`` list."""
        found, pending = [], [self.root]
        while pending:
            pid = pending.pop()
            found.append(pid)
            try:
                for tid in listing(self.proc_fd, f"{pid}/task"):
                    pending += [int(c) for c in read_at(self.proc_fd, f"{pid}/task/{tid}/children").split()]
            except OSError:  # it exited meanwhile
                continue
        return found

    def read(self) -> Reading:
        threads, ticks = {}, {}
        for pid in self.processes():
            try:
                fields = read_at(self.proc_fd, f"{pid}/stat").rpartition(")")[2].split()
                ticks[pid] = sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime: the dead's time too
                for tid in listing(self.proc_fd, f"{pid}/task"):
                    threads[(pid, int(tid))] = int(read_at(self.proc_fd, f"{pid}/task/{tid}/schedstat").split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return Reading(threads, ticks)

    def pin(self) -> None:
        """The calling thread: the main thread of the tree's busiest process, looked at while it runs harness code only."""
        per_process: Dict[int, int] = {}
        for (pid, _tid), ns in self.read().threads.items():
            per_process[pid] = per_process.get(pid, 0) + ns
        if per_process:
            pid = max(per_process, key=per_process.__getitem__)
            self.calling = (pid, pid)

    def others_ms(self, before: Reading, after: Reading) -> Dict[str, float]:
        """CPU ms between two readings: the calling thread's, every other thread's (live ones by schedstat; those
        that exited meanwhile by the tree's ticks, which count them), and the tree's whole by its ticks."""
        delta = {key: ns - before.threads.get(key, 0) for key, ns in after.threads.items()}
        calling = delta.get(self.calling, 0) if self.calling else 0
        live_others = sum(ns for key, ns in delta.items() if key != self.calling)
        exited = tree = 0.0
        for pid, ticks in after.ticks.items():
            grew = (ticks - before.ticks.get(pid, 0)) * TICK_NS
            live = sum(ns for (owner, _tid), ns in delta.items() if owner == pid)
            # each of its four tick counts rounds down once: what exceeds the live threads' time by more ran on the dead
            exited += max(0.0, grew - live - 4 * TICK_NS) if grew else 0.0
            tree += grew
        return {"calling_ms": calling / 1e6, "others_ms": (live_others + exited) / 1e6, "tree_ms": tree / 1e6}


def allowed_ms(wall_ms: float, mode: str) -> float:
    """Other threads' CPU an honest window of ``wall_ms`` may show under ``mode`` (a timing mode)."""
    share, floor = ALLOWANCE["host" if mode == "host" else "gpu"]
    return max(floor, share * wall_ms)


def finding(what: str, shape: dict, cpu: Dict[str, float], wall_ms: float, mode: str) -> Optional[dict]:
    """A ``host_thread_cpu`` finding when threads besides the calling one worked more than allowed in a window of
    ``wall_ms`` (``what``: which window), else None."""
    allowed = allowed_ms(wall_ms, mode)
    if cpu["others_ms"] <= allowed:
        return None
    return {
        "kind": "host_thread_cpu",
        "shape": shape,
        "detail": f"{shape}: during {what}, threads other than the calling one used {cpu['others_ms']:.2f} ms of CPU "
        f"in {wall_ms:.1f} ms (at most {allowed:.2f} allowed), read from /proc by the referee",
    }
