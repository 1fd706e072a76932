"""The reference timers kbsweep's own figure is checked against: CUDA-graph replay of one captured call, and
KernelBench's event timer as its ``measure_ref_program_time`` runs it (a KernelBench problem's timed path)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch


def time_cuda_graph(fn: Callable[..., Any], inputs: Sequence[Any], replays: int = 50) -> Optional[float]:
    """Launch-overhead-free time: one captured call replayed; None when the call cannot be captured."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(*inputs)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / replays
    except Exception:  # capture refused (host sync, allocation, ...): no graph figure
        torch.cuda.synchronize()
        return None


# KernelBench's timing (ScalingIntelligence/KernelBench src/kernelbench/timing.py, commit 423217d): its default
# ``time_execution_with_cuda_event`` as ``measure_ref_program_time`` runs it for a reference: 5 warm-up calls,
# each synchronized, the allocator's cache emptied, then 1 discarded + 100 trials, each one: full sync, a
# 256 MiB int64 ``fill_`` (its L2 clear) outside the events, events around the call, full sync. One input set,
# no rotation. Its figure is the mean of the trials (``get_timing_stats``: mean, population std, min, max).
KERNELBENCH_TIMING = {"num_warmup": 5, "num_trials": 100, "discard_first": 1, "l2_clear_bytes": 256 << 20}


def time_kernelbench(
    fn: Callable[..., Any],
    args: Sequence[Any],
    device: Any,
    num_warmup: int = 5,
    num_trials: int = 100,
    discard_first: int = 1,
) -> Dict[str, Any]:
    """``fn(*args)`` timed as KernelBench times it: CUDA events on a GPU; on a CPU (where KernelBench has no
    timer: its ``host_time`` needs CUDA too) the same loop with ``perf_counter`` and no sync or L2 clear."""
    cuda = torch.device(device).type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)  # noqa: E731
    for _ in range(num_warmup):
        fn(*args)
        sync()
    if cuda:
        torch.cuda.empty_cache()
    samples: List[float] = []
    for trial in range(num_trials + discard_first):
        sync()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            dummy = torch.empty(KERNELBENCH_TIMING["l2_clear_bytes"] // 8, dtype=torch.int64, device=device)
            dummy.fill_(42)  # its clear_l2_cache: a write, enqueued before the start event
            del dummy
            start.record()
            fn(*args)
            end.record()
            sync()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn(*args)
            ms = (time.perf_counter() - t0) * 1e3
        if trial >= discard_first:
            samples.append(ms)
    return {
        "method": "cuda_event" if cuda else "host_perf_counter",
        "mean_ms": statistics.fmean(samples),
        "std_ms": statistics.pstdev(samples),
        "min_ms": min(samples),
        "max_ms": max(samples),
        "median_ms": statistics.median(samples),
        "num_trials": len(samples),
        "num_warmup": num_warmup,
        "discard_first": discard_first,
    }
