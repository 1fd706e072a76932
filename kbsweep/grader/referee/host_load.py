"""Other processes' CPU work on the CPUs the referee runs on, measured by the referee while it times a baseline.

A launch-bound baseline (an eager model of many small kernels: the mega track's ``baseline.py``) is as fast as its
CPU launches it, so processes contending for the referee's CPUs slow it, and a speedup that divides by it then
rises with them. A timed baseline is also cached for every later grade on that machine. Other cells' agents, their
shells and compiles, or a process a candidate's sandbox left behind could all be those processes. So the referee
measures them itself, from ``/proc/stat`` (the busy time of each CPU it may run on: a pid namespace does not hide
it) less the CPU time of its own process tree (itself and every process it started: torch.compile's and Triton's
compile workers, which work while a compile baseline is first called), and times a baseline only while that work is
small (:class:`QuietHost`).
Work on CPUs it may not run on (another Slurm job's or container's cores) is not counted. On a 16-vCPU H200 VM, 8
processes spinning lifted the mega baseline up to 1.9× and the score 29 %, with half the CPUs still idle
(docs/benchmarks.md, "Baselines and the host's load"): a count of idle CPUs would not have caught it.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Callable, Collection, Dict, List, Optional, Tuple

STAT = Path("/proc/stat")
PROC = Path("/proc")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
# One look at the host while waiting for it to be quiet, and the shortest window a timing's load is read over:
# /proc/stat counts in ticks (10 ms), so a window of a few ms would read one tick as several CPUs.
SAMPLE_S = 1.0


def own_cpus() -> Collection[int]:
    """The CPUs this process may run on (a Slurm job's or a container's share of the host; every CPU where the
    system does not say, as on macOS, which has no /proc/stat either: nothing is gated there)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return affinity(0) if affinity else range(os.cpu_count() or 1)


def host_busy_s(stat: Path = STAT, cpus: Optional[Collection[int]] = None) -> Optional[float]:
    """Seconds ``cpus`` (default: this process's) have spent busy since boot (user, nice, system, irq, softirq: not
    idle, iowait or the time a hypervisor took); None where ``/proc/stat`` cannot be read (not Linux)."""
    cpus = own_cpus() if cpus is None else cpus
    busy = 0
    try:
        for line in stat.read_text().splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[:7])
                busy += user + nice + system + irq + softirq
    except (OSError, ValueError):
        return None
    return busy * TICK_S


def own_cpu_s(proc: Path = PROC) -> float:
    """CPU seconds of this process's tree: its own threads, its live descendants (from each ``/proc/<pid>/stat``'s
    parent and times, read in one pass) and the children it has reaped, whose time the kernel adds to its own
    record. A descendant's time thus stays counted when it exits, once reaped (zombies still show theirs)."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage) + descendants_cpu_s(os.getpid(), proc)


def descendants_cpu_s(root: int, proc: Path = PROC) -> float:
    """CPU seconds (user and system, their reaped children's included) of ``root``'s live descendants."""
    parent, ticks = {}, {}
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:  # the command name may hold spaces and parentheses: the fields start after its last ')'
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:  # it exited meanwhile
            continue
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    children: Dict[int, List[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, pending = 0, list(children.get(root, ()))
    while pending:
        pid = pending.pop()
        total += ticks[pid]
        pending.extend(children.get(pid, ()))
    return total * TICK_S


class OtherWork:
    """CPUs' worth of work by other processes on ``on`` (default: this process's CPUs) over a ``with`` block:
    (their busy time − this process tree's CPU time) / wall; ``cpus`` is None where /proc/stat cannot be read."""

    def __init__(
        self, stat: Path = STAT, clock: Callable[[], float] = time.monotonic, on: Optional[Collection[int]] = None
    ):
        self.stat, self.clock, self.on = stat, clock, own_cpus() if on is None else on
        self.cpus: Optional[float] = None

    def __enter__(self) -> "OtherWork":
        self.began = (self.clock(), host_busy_s(self.stat, self.on), own_cpu_s())
        return self

    def __exit__(self, *exc: object) -> None:
        wall, busy, own = self.clock(), host_busy_s(self.stat, self.on), own_cpu_s()
        if busy is not None and self.began[1] is not None and wall > self.began[0]:
            self.cpus = max(0.0, (busy - self.began[1] - (own - self.began[2])) / (wall - self.began[0]))


class HostBusy(Exception):
    """The referee's CPUs did not stay quiet for a baseline's timing within the wait allowed."""


class QuietHost:
    """Times trusted callables while other processes use at most ``limit_cpus`` of the referee's CPUs: waits
    (looking every :data:`SAMPLE_S`) until they do, times, and times again once they do if they did not over the
    timing. Waiting counts against ``wait_s`` for the whole grade; past it, :class:`HostBusy`. ``limit_cpus`` None:
    no gate, the load recorded only. ``agree(busy)``: whether any rank of the grade found its CPUs busy, so that
    every rank waits and times again alike."""

    def __init__(
        self,
        limit_cpus: Optional[float],
        wait_s: float,
        agree: Callable[[bool], bool] = bool,
        stat: Path = STAT,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        on: Optional[Collection[int]] = None,
    ):
        self.on = own_cpus() if on is None else on
        self.limit, self.wait_left, self.agree = limit_cpus, wait_s, agree
        self.stat, self.sleep, self.clock = stat, sleep, clock

    def busy(self, cpus: Optional[float]) -> bool:
        return self.limit is not None and self.agree(cpus is not None and cpus > self.limit)

    def reason(self, cpus: Optional[float]) -> str:
        """Why the host counts as busy: this rank's load, or another rank's where this one's was within the limit or
        could not be read (``agree`` made it busy)."""
        limit = f"at most {self.limit:g}: grade.timing.quiet_cpus"
        if cpus is None or self.limit is None or cpus <= self.limit:
            return f"another rank of the grade found its CPUs busy ({limit})"
        return f"other processes used {cpus:.1f} of the referee's {len(self.on)} CPUs ({limit})"

    def await_quiet(self, what: str) -> None:
        if self.limit is None:
            return
        while True:
            with OtherWork(self.stat, self.clock, self.on) as look:
                self.sleep(SAMPLE_S)
            if not self.busy(look.cpus):
                return
            self.wait_left -= SAMPLE_S
            if self.wait_left < 0:
                raise HostBusy(f"the host stayed busy while {what} waited to be timed: {self.reason(look.cpus)}")

    def time(self, what: str, timer: Callable[[], dict]) -> Tuple[dict, Optional[float]]:
        """(``timer()``'s record, the other processes' CPUs while it ran) from a timing on a quiet host. Without a
        limit nothing waits: a timing shorter than a look records no load (its ticks would read as noise)."""
        for _attempt in range(2):
            self.await_quiet(what)
            with OtherWork(self.stat, self.clock, self.on) as load:
                began = self.clock()
                timed = timer()
                short = began + SAMPLE_S - self.clock()
                if short > 0 and self.limit is not None:
                    self.sleep(short)
            if self.limit is None and short > 0:
                return timed, None
            if not self.busy(load.cpus):
                return timed, load.cpus
        raise HostBusy(f"the host was busy while {what} was timed, twice: {self.reason(load.cpus)}")
