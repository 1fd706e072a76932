"""The runner's one profiler session over every candidate call, and what the audit reads from it: the torch ops
run inside the calls, the torch.distributed ops, and per group of calls the GPU kernels those calls launched.

A call's range is named :data:`CALL_RANGE` plus the id the referee drew for the command that made it, never a
stage's name: the runner does not know which stage a call belongs to (``groups``, sent with the evidence
command after the last call, says). The name is public, so a range of it proves nothing alone: ranges whose id no
command of the grade had, and ranges inside another, are counted as forged and bound nothing; the referee
compares the ranges it reads with the calls it made."""

from __future__ import annotations

import bisect
import contextlib
import statistics
from typing import Any, Dict, Iterable, List, Optional

import torch

CALL_RANGE = "kbsweep::call"  # the profiler annotation around each candidate call (its command's id follows)
TOKEN_CHARS = 12  # a command's id: hex characters the referee draws (kbsweep.grader.referee.candidate)
COMM_PREFIXES = (
    "c10d::",
    "_c10d_functional::",
    "c10d_functional::",
    "nccl:",
    "gloo:",
)  # torch.distributed's ops, per backend
# the tag suffix of calls invoked while a replay's graph is captured: nothing ran in their ranges, so a timed shape's
# kernel profile (launches per call, the single-kernel gate) counts the event-timed calls only
CAPTURE_TAG = "/capture"


def profiler_session(device: Any):
    """The runner's one profiler session: CPU ops with FLOPs (the dispatcher sees ops that torch dispatch modes
    do not), and on GPUs every kernel."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if getattr(device, "type", device) == "cuda" else [])
    return profile(activities=activities, with_flops=True)


def session_evidence(prof: Any, groups: Dict[str, str], calls: Dict[str, int]) -> Dict[str, Any]:
    """From a finished session, over the outermost call ranges of this grade's commands (``groups``: command id ->
    its group): the ops run in them (with Triton's launches: what a launch itself runs is glue, a copy or an empty,
    and a range of any name bounds nothing), the torch.distributed ops, the GPU kernels, per group the number of
    ranges and each range's FLOPs, and per group of ``calls`` (group -> calls the referee made) the kernels of
    those calls with their GPU time, and the host time of those calls and their ops (:class:`OpTimes`);
    ``forged_ranges``: ranges of the harness's name that no command opened, or inside another."""
    cpu = torch.autograd.DeviceType.CPU
    named, gpu = [], []  # each event read once: a grade's session holds tens of thousands, each field a call into C++
    for e in prof.profiler.kineto_results.events():
        if e.device_type() == cpu:
            named.append((e.name(), e.start_ns(), e))
        else:
            gpu.append(e)
    known, forged = [], 0
    for name, start, e in named:  # the host's spans (kineto repeats each annotation on the GPU's timeline too)
        if name.startswith(CALL_RANGE):
            suffix = name[len(CALL_RANGE) :]
            group = group_of(suffix, groups)
            if group is None:
                forged += 1
            else:
                known.append((start, e.end_ns(), group))
    outer: List[tuple] = []
    for span in sorted(known):
        if outer and span[0] <= outer[-1][1]:
            forged += 1  # the harness's calls follow one another: a range inside (or across) another is not its own
        else:
            outer.append(span)
    calls_at = Spans((start, end) for start, end, _ in outer)
    ops: Dict[str, int] = {}
    comm: Dict[str, int] = {}
    range_flops = [0] * len(outer)
    range_ops: List[List[tuple]] = [[] for _ in outer]  # per range: (start, end, name) of its ops, for their times
    for name, start, e in named:
        at = calls_at.index(start)
        if at < 0 or name.startswith(CALL_RANGE):
            continue
        if name.startswith(COMM_PREFIXES):
            comm[name] = comm.get(name, 0) + 1
        if (
            "::" in name and not name.startswith("profiler::") and not e.is_user_annotation()
        ):  # a range of any name is no op
            ops[name] = ops.get(name, 0) + 1
            range_flops[at] += int(e.flops() or 0)
            range_ops[at].append((start, e.end_ns(), name))
    by_group: Dict[str, List[tuple]] = {}
    flops_by_group: Dict[str, List[int]] = {}
    op_times: Dict[str, OpTimes] = {}
    for (start, end, group), flops, spans in zip(outer, range_flops, range_ops):
        by_group.setdefault(group, []).append((start, end))
        flops_by_group.setdefault(group, []).append(flops)
        op_times.setdefault(group, OpTimes()).add(start, end, spans)
    # the GPU timeline's copies of this grade's call ranges are not kernels; a kernel merely named like one is
    kernels = GpuKernels(
        named,
        [e for e in gpu if not (e.name().startswith(CALL_RANGE) and group_of(e.name()[len(CALL_RANGE) :], groups))],
    )
    profiles = {group: kernels.profile(by_group[group], count) for group, count in calls.items() if by_group.get(group)}
    return {
        "ops": ops,
        "comm_ops": comm,
        "profiles": profiles,
        "forged_ranges": forged,
        "kernels": sorted(kernels.profile([(s, e) for s, e, _ in outer], 1)["kernels"]) if outer else [],
        "ranges": {group: len(spans) for group, spans in by_group.items()},
        "range_flops": flops_by_group,
        "op_times": {group: times.summary() for group, times in op_times.items() if group in calls},
    }


class OpTimes:
    """The host time of one group's calls: each call range's span, and the outermost torch ops inside it by name
    (an op nested in another is its time already), so the ops' times and the rest (Python, an interpreter) add up
    to the calls'."""

    def __init__(self) -> None:
        self.range_ns = 0
        self.ops: Dict[str, List[int]] = {}  # name -> [count, ns]

    def add(self, start: int, end: int, spans: List[tuple]) -> None:
        self.range_ns += end - start
        reach = start
        for op_start, op_end, name in sorted(spans):
            if op_start < reach:  # inside the last outermost op
                continue
            entry = self.ops.setdefault(name, [0, 0])
            entry[0] += 1
            entry[1] += min(op_end, end) - op_start
            reach = op_end

    def summary(self, most: int = 50) -> Dict[str, Any]:
        """The call ranges' time and the ``most`` ops of most time (the evidence message stays small)."""
        top = sorted(self.ops.items(), key=lambda item: -item[1][1])[:most]
        return {"range_ns": self.range_ns, "ops": {name[:200]: value for name, value in top}}


def group_of(suffix: str, groups: Dict[str, str]) -> Optional[str]:
    """The group of a call range named ``CALL_RANGE + suffix`` (a command's id, then a tag of the runner's own such
    as :data:`CAPTURE_TAG`), or None when no command of the grade had that id."""
    group = groups.get(suffix[:TOKEN_CHARS])
    return None if group is None else group + suffix[TOKEN_CHARS:]


class GpuKernels:
    """A session's GPU kernels, each tied to its launch by correlation id (the runtime or driver call that
    launched it: a Triton kernel's ``cuLaunchKernelEx``, a library's ``cudaLaunchKernel``); copies and sets are not
    kernels."""

    def __init__(self, host: List[tuple], device_events: List[Any]):
        """``host``: the host's events as (name, start ns, event); ``device_events``: the others."""
        launched_at = {e.correlation_id(): start for name, start, e in host if name.startswith(("cuda", "cu"))}
        cuda = torch.autograd.DeviceType.CUDA
        self.kernels = [
            (launched_at.get(e.correlation_id()), e.name(), e.device_resource_id(), e.end_ns() - e.start_ns())
            for e in device_events
            if e.device_type() == cuda and not e.is_user_annotation() and not e.name().startswith(("Memcpy", "Memset"))
        ]

    def profile(self, ranges: List[tuple], calls: int) -> Dict[str, Any]:
        """Kernel names, launches per call, GPU time and streams of the kernels launched from inside ``ranges`` (a
        candidate's calls; the flushes and output copies around them are not counted); a CUDA-graph
        replay counts its kernels. ``median_launches``: the launches of the median call (a one-off launch, say a
        CUDA-graph capture's warm-up, moves the mean only)."""
        ranges = sorted(
            ranges
        )  # a candidate's calls follow one another: by start, the one holding ``at`` is the last before it
        starts = [start for start, _ in ranges]
        per_range = [0] * len(ranges)
        inside = []
        for at, name, stream, ns in self.kernels:
            where = bisect.bisect_right(starts, at) - 1 if at is not None else -1
            if where >= 0 and at <= ranges[where][1]:
                per_range[where] += 1
                inside.append((name, stream, ns))
        kernels: Dict[str, int] = {}
        kernel_ns: Dict[str, int] = {}
        for name, _, ns in inside:
            kernels[name] = kernels.get(name, 0) + 1
            kernel_ns[name[:200]] = kernel_ns.get(name[:200], 0) + ns
        calls = max(calls, 1)
        return {
            "launches_per_call": len(inside) / calls,
            "median_launches": statistics.median(per_range) if per_range else 0.0,
            "kernels": {name[:200]: count / calls for name, count in sorted(kernels.items())},
            "kernel_ns": kernel_ns,  # each kernel's GPU time over all the calls
            "streams": sorted({stream for _, stream, _ in inside}),
        }


class Spans:
    """Time spans, overlapping ones merged: whether an instant falls in one, by binary search (a grade's session
    holds tens of thousands of events and thousands of calls)."""

    def __init__(self, spans: Iterable[tuple]):
        merged: List[List[int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts, self.ends = [s for s, _ in merged], [e for _, e in merged]

    def __contains__(self, t: int) -> bool:
        return self.index(t) >= 0

    def index(self, t: int) -> int:
        """The index of the merged span holding ``t``, or -1."""
        i = bisect.bisect_right(self.starts, t) - 1
        return i if i >= 0 and t <= self.ends[i] else -1


@contextlib.contextmanager
def kernels_unrecorded(session: Any):
    """The profiler session's GPU records paused: over a replay, where no candidate code runs (the kernels it
    replays are those the event-timed batches beside it run, recorded there) and CUPTI's cost per kernel (1.4%
    of a 4096³ GEMM on the H200) would be the call's."""
    from torch.profiler import ProfilerActivity

    session.toggle_collection_dynamic(False, [ProfilerActivity.CUDA])
    try:
        yield
    finally:
        session.toggle_collection_dynamic(True, [ProfilerActivity.CUDA])


@contextlib.contextmanager
def profiled(device: torch.device):
    """The profiler session the runner keeps on over timed batches, here too on GPUs (its host overhead is part of
    a batch, its per-kernel cost part of every event-timed call); yields the session (None off GPUs)."""
    if device.type != "cuda":
        yield None
        return
    with profiler_session(device) as session:
        yield session
