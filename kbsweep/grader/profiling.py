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
    events = list(prof.profiler.kineto_results.events())
    cpu = torch.autograd.DeviceType.CPU
    ranges: Dict[str, List[tuple]] = {}
    for e in events:  # the host's spans (kineto repeats each annotation on the GPU's timeline too)
        if e.device_type() == cpu and e.name().startswith(CALL_RANGE):
            ranges.setdefault(e.name()[len(CALL_RANGE):], []).append((e.start_ns(), e.end_ns()))
    launches = Spans((e.start_ns(), e.end_ns()) for e in events if e.device_type() == cpu and e.name() == KERNEL_RANGE)
    everywhere = [span for spans in ranges.values() for span in spans]
    calls_at = Spans(everywhere)
    ops: Dict[str, int] = {}
    comm: Dict[str, int] = {}
    flops = 0
    for e in events:
        if e.device_type() != cpu or e.start_ns() not in calls_at:
            continue
        if e.name().startswith(COMM_PREFIXES):
            comm[e.name()] = comm.get(e.name(), 0) + 1
        if "::" in e.name() and not e.name().startswith(("kbsweep::", "profiler::")) and e.start_ns() not in launches:
            ops[e.name()] = ops.get(e.name(), 0) + 1
            flops += int(e.flops() or 0)
    profiles = {tag: kernel_profile(events, ranges.get(tag, []), count) for tag, count in calls.items() if ranges.get(tag)}
    kernels = sorted(kernel_profile(events, everywhere, 1)["kernels"]) if everywhere else []
    return {"ops": ops, "flops": flops, "comm_ops": comm, "kernels": kernels, "profiles": profiles}


def kernel_profile(events: List[Any], ranges: List[tuple], calls: int) -> Dict[str, Any]:
    """Kernel names, launches per call and streams of the kernels launched from inside ``ranges`` (a candidate's
    calls; the flushes, canaries and output copies around them are not counted); a CUDA-graph replay counts its
    kernels. A kernel is tied to its launch by correlation id (the runtime or driver call that launched it: a
    Triton kernel's ``cuLaunchKernelEx``, a library's ``cudaLaunchKernel``); the profiler's annotations on the
    GPU's timeline are not kernels. ``median_launches``: the launches of the median call (a one-off launch, say a
    CUDA-graph capture's warm-up, moves the mean only)."""
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    launched_at = {e.correlation_id(): e.start_ns() for e in events if e.device_type() == cpu and e.name().startswith(("cuda", "cu"))}
    ranges = sorted(ranges)  # a candidate's calls follow one another: by start, the one holding ``at`` is the last before it
    starts = [start for start, _ in ranges]
    per_range = [0] * len(ranges)
    gpu = []
    for event in events:
        if event.device_type() != cuda or event.name().startswith(("Memcpy", "Memset", "kbsweep::")):
            continue
        at = launched_at.get(event.correlation_id())
        where = bisect.bisect_right(starts, at) - 1 if at is not None else -1
        if where >= 0 and at <= ranges[where][1]:
            per_range[where] += 1
            gpu.append(event)
    kernels: Dict[str, int] = {}
    for event in gpu:
        kernels[event.name()] = kernels.get(event.name(), 0) + 1
    calls = max(calls, 1)
    return {
        "launches_per_call": len(gpu) / calls,
        "median_launches": statistics.median(per_range) if per_range else 0.0,
        "kernels": {name[:200]: count / calls for name, count in sorted(kernels.items())},
        "streams": sorted({e.device_resource_id() for e in gpu}),
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
