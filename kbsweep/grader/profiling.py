"""The runner's one profiler session over every candidate call, and what the audit reads from it: the torch ops
run inside the calls, the torch.distributed ops, and per call tag the GPU kernels those calls launched."""
from __future__ import annotations

import bisect
import contextlib
import statistics
from typing import Any, Dict, Iterable, List

import torch

from kbsweep.audit.runtime import KERNEL_RANGE

CALL_RANGE = "kbsweep::call"  # the profiler annotation around each candidate call (its tag follows)
COMM_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::", "nccl:", "gloo:")  # torch.distributed's ops, per backend
# the tag suffix of calls invoked while a replay's graph is captured: nothing ran in their ranges, so a timed shape's
# kernel profile (launches per call, the single-kernel gate) counts the event-timed calls only
CAPTURE_TAG = "/capture"


def profiler_session(device: Any):
    """The runner's one profiler session: CPU ops with FLOPs (the dispatcher sees ops that torch dispatch modes
    do not), and on GPUs every kernel."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if getattr(device, "type", device) == "cuda" else [])
    return profile(activities=activities, with_flops=True)


def session_evidence(prof: Any, calls: Dict[str, int]) -> Dict[str, Any]:
    """From a finished session: the aten ops (and their FLOPs) run inside candidate calls but outside its own
    kernel launches, the torch.distributed ops and the GPU kernels of every candidate call, and per call tag
    (``calls``: tag -> number of calls) the kernels of those calls."""
    cpu = torch.autograd.DeviceType.CPU
    named, gpu = [], []  # each event read once: a grade's session holds tens of thousands, each field a call into C++
    for e in prof.profiler.kineto_results.events():
        if e.device_type() == cpu:
            named.append((e.name(), e.start_ns(), e))
        else:
            gpu.append(e)
    ranges: Dict[str, List[tuple]] = {}
    for name, start, e in named:  # the host's spans (kineto repeats each annotation on the GPU's timeline too)
        if name.startswith(CALL_RANGE):
            ranges.setdefault(name[len(CALL_RANGE):], []).append((start, e.end_ns()))
    launches = Spans((start, e.end_ns()) for name, start, e in named if name == KERNEL_RANGE)
    everywhere = [span for spans in ranges.values() for span in spans]
    calls_at = Spans(everywhere)
    ops: Dict[str, int] = {}
    comm: Dict[str, int] = {}
    flops = 0
    for name, start, e in named:
        if start not in calls_at:
            continue
        if name.startswith(COMM_PREFIXES):
            comm[name] = comm.get(name, 0) + 1
        if "::" in name and not name.startswith(("kbsweep::", "profiler::")) and start not in launches:
            ops[name] = ops.get(name, 0) + 1
            flops += int(e.flops() or 0)
    kernels = GpuKernels(named, gpu)
    profiles = {tag: kernels.profile(ranges.get(tag, []), count) for tag, count in calls.items() if ranges.get(tag)}
    return {"ops": ops, "flops": flops, "comm_ops": comm, "kernels": sorted(kernels.profile(everywhere, 1)["kernels"]) if everywhere else [],
            "profiles": profiles}


class GpuKernels:
    """A session's GPU kernels, each tied to its launch by correlation id (the runtime or driver call that
    launched it: a Triton kernel's ``cuLaunchKernelEx``, a library's ``cudaLaunchKernel``); the profiler's
    annotations on the GPU's timeline, copies and sets are not kernels."""

    def __init__(self, host: List[tuple], device_events: List[Any]):
        """``host``: the host's events as (name, start ns, event); ``device_events``: the others."""
        launched_at = {e.correlation_id(): start for name, start, e in host if name.startswith(("cuda", "cu"))}
        cuda = torch.autograd.DeviceType.CUDA
        self.kernels = [(launched_at.get(e.correlation_id()), e.name(), e.device_resource_id()) for e in device_events
                        if e.device_type() == cuda and not e.name().startswith(("Memcpy", "Memset", "kbsweep::"))]

    def profile(self, ranges: List[tuple], calls: int) -> Dict[str, Any]:
        """Kernel names, launches per call and streams of the kernels launched from inside ``ranges`` (a
        candidate's calls; the flushes and output copies around them are not counted); a CUDA-graph
        replay counts its kernels. ``median_launches``: the launches of the median call (a one-off launch, say a
        CUDA-graph capture's warm-up, moves the mean only)."""
        ranges = sorted(ranges)  # a candidate's calls follow one another: by start, the one holding ``at`` is the last before it
        starts = [start for start, _ in ranges]
        per_range = [0] * len(ranges)
        inside = []
        for at, name, stream in self.kernels:
            where = bisect.bisect_right(starts, at) - 1 if at is not None else -1
            if where >= 0 and at <= ranges[where][1]:
                per_range[where] += 1
                inside.append((name, stream))
        kernels: Dict[str, int] = {}
        for name, _ in inside:
            kernels[name] = kernels.get(name, 0) + 1
        calls = max(calls, 1)
        return {
            "launches_per_call": len(inside) / calls,
            "median_launches": statistics.median(per_range) if per_range else 0.0,
            "kernels": {name[:200]: count / calls for name, count in sorted(kernels.items())},
            "streams": sorted({stream for _, stream in inside}),
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
        i = bisect.bisect_right(self.starts, t) - 1
        return i >= 0 and t <= self.ends[i]


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
