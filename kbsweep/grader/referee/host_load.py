"""The host's CPU work besides the referee's own, measured by the referee while it times a baseline.

A launch-bound baseline (an eager model of many small kernels: the mega track's ``baseline.py``) is as fast as the
host's CPU lets it launch, so other work on the host slows it; a speedup that divides by it then rises with load.
And a timed baseline is cached for every later grade on that machine. Other cells' agents, their shells and
compiles, or a process a candidate's sandbox left behind, could all raise it. So the referee measures that work
itself, from ``/proc/stat`` (the whole host's busy time: a pid namespace does not hide it) less its own process's
CPU time, and times a baseline only while the host is quiet (:class:`QuietHost`).
"""
from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Callable, Optional, Tuple

STAT = Path("/proc/stat")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
# One look at the host while waiting for it to be quiet, and the shortest window a timing's load is read over:
# /proc/stat counts in ticks (10 ms), so a window of a few ms would read one tick as several CPUs.
SAMPLE_S = 1.0


def host_busy_s(stat: Path = STAT) -> Optional[float]:
    """Seconds every CPU of the host has spent busy since boot (user, nice, system, irq, softirq: not idle, iowait
    or the time a hypervisor took); None where ``/proc/stat`` cannot be read (not Linux)."""
    try:
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:8])
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq) * TICK_S


def own_cpu_s() -> float:
    """CPU seconds of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class OtherWork:
    """CPUs' worth of work by other processes over a ``with`` block: (host busy − own CPU) / wall; ``cpus`` is None
    where the host's busy time cannot be read."""

    def __init__(self, stat: Path = STAT, clock: Callable[[], float] = time.monotonic):
        self.stat, self.clock, self.cpus = stat, clock, None

    def __enter__(self) -> "OtherWork":
        self.began = (self.clock(), host_busy_s(self.stat), own_cpu_s())
        return self

    def __exit__(self, *exc: object) -> None:
        wall, busy, own = self.clock(), host_busy_s(self.stat), own_cpu_s()
        if busy is not None and self.began[1] is not None and wall > self.began[0]:
            self.cpus = max(0.0, (busy - self.began[1] - (own - self.began[2])) / (wall - self.began[0]))


class HostBusy(Exception):
    """The host did not stay quiet for a baseline's timing within the wait allowed."""


class QuietHost:
    """Times trusted callables while other processes use at most ``limit_cpus`` CPUs of the host: waits (looking
    every :data:`SAMPLE_S`) until they do, times, and times again once quiet if they did not stay so. Waiting
    counts against ``wait_s`` for the whole grade; past it, :class:`HostBusy`. ``limit_cpus`` None: no gate, the
    load recorded only. ``agree(busy)``: whether any rank of the grade found its host busy, so that every rank
    waits and times again alike."""

    def __init__(self, limit_cpus: Optional[float], wait_s: float, agree: Callable[[bool], bool] = bool,
                 stat: Path = STAT, sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        self.limit, self.wait_left, self.agree = limit_cpus, wait_s, agree
        self.stat, self.sleep, self.clock = stat, sleep, clock

    def busy(self, cpus: Optional[float]) -> bool:
        return self.limit is not None and self.agree(cpus is not None and cpus > self.limit)

    def await_quiet(self, what: str) -> None:
        if self.limit is None:
            return
        while True:
            with OtherWork(self.stat, self.clock) as look:
                self.sleep(SAMPLE_S)
            if not self.busy(look.cpus):
                return
            self.wait_left -= SAMPLE_S
            if self.wait_left < 0:
                raise HostBusy(f"the host stayed busy while {what} waited to be timed: other processes used {look.cpus:.1f} CPUs "
                               f"(at most {self.limit:g} while a baseline is timed: grade.timing.quiet_cpus)")

    def time(self, what: str, timer: Callable[[], dict]) -> Tuple[dict, Optional[float]]:
        """(``timer()``'s record, the other processes' CPUs while it ran) from a timing on a quiet host."""
        for _attempt in range(2):
            self.await_quiet(what)
            with OtherWork(self.stat, self.clock) as load:
                began = self.clock()
                timed = timer()
                short = began + SAMPLE_S - self.clock()
                if short > 0:
                    self.sleep(short)
            if not self.busy(load.cpus):
                return timed, load.cpus
        raise HostBusy(f"the host was busy while {what} was timed, twice: other processes used {load.cpus:.1f} CPUs "
                       f"(at most {self.limit:g}: grade.timing.quiet_cpus)")
