"""Timing: CUDA events after a full sync with L2 flush and rotating inputs on GPU; perf_counter on CPU.

Host launch latency (large under some hypervisors: 100+ us per launch) is kept out of the event interval
by a short GPU spin enqueued before the start event, sized from the call's own host enqueue time; the
host wall clock of the same call is recorded beside it. Latency-regime problems skip the spin: their
figure includes launches, and a CUDA-graph replay figure is reported separately.

Stopping rule (GPU MODE's): at least ``min_runs``, then stop when the relative standard error of the mean
is under ``rel_err``, or ``max_time_s`` of measured time, or ``max_runs``. The score uses the median.
"""
from __future__ import annotations

import ctypes
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

CUDA_LIMIT_PERSISTING_L2 = 0x06
SPIN_CYCLES_PER_US = 2000  # about the SM clock of a Hopper under load; a longer spin is harmless


@dataclass
class TimingConfig:
    min_runs: int = 3
    max_runs: int = 100
    rel_err: float = 0.001
    max_time_s: float = 10.0
    warmup_runs: int = 3
    recheck_fraction: float = 0.1


def summarize(samples_ms: List[float], wall_ms: List[float]) -> Dict[str, Any]:
    n = len(samples_ms)
    mean = statistics.fmean(samples_ms)
    std = statistics.stdev(samples_ms) if n > 1 else 0.0
    half = 1.96 * std / math.sqrt(n) if n > 1 else 0.0
    quartiles = statistics.quantiles(samples_ms, n=4) if n > 1 else [samples_ms[0]] * 3
    return {
        "median_ms": statistics.median(samples_ms),
        "mean_ms": mean,
        "std_ms": std,
        "min_ms": min(samples_ms),
        "iqr_ms": quartiles[2] - quartiles[0],
        "ci95_ms": [mean - half, mean + half],
        "runs": n,
        "wall_median_ms": statistics.median(wall_ms),
        "wall_event_ratio": statistics.median(wall_ms) / max(statistics.median(samples_ms), 1e-9),
    }


def reset_persisting_l2() -> bool:
    """Set the persisting-L2 limit to 0 and reset persisting lines (defeats L2-persistence carve-outs)."""
    try:
        lib = ctypes.CDLL("libcudart.so")
    except OSError:
        import glob
        import os

        candidates = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcudart.so*"))
        if not candidates:
            return False
        lib = ctypes.CDLL(candidates[0])
    ok = lib.cudaDeviceSetLimit(CUDA_LIMIT_PERSISTING_L2, ctypes.c_size_t(0)) == 0
    return ok and lib.cudaCtxResetPersistingL2Cache() == 0


def stop(samples: List[float], cfg: TimingConfig, elapsed_s: float) -> bool:
    n = len(samples)
    if n < cfg.min_runs:
        return False
    if n >= cfg.max_runs or elapsed_s > cfg.max_time_s:
        return True
    mean = statistics.fmean(samples)
    return n > 1 and statistics.stdev(samples) / math.sqrt(n) / mean < cfg.rel_err


def time_cuda(
    fn: Callable[..., Any],
    input_sets: Sequence[Sequence[Any]],
    cfg: TimingConfig,
    l2_bytes: int,
    recheck: Optional[Callable[[Sequence[Any], Any], None]] = None,
    hide_launch: bool = True,
) -> Dict[str, Any]:
    """Events around each call, after a full sync and an L2 flush (2x the L2), inputs rotated per call."""
    flush = torch.empty(max(2 * l2_bytes, 1 << 20) // 4, dtype=torch.int32, device="cuda")
    l2_reset = reset_persisting_l2()
    enqueue_us = []
    for i in range(cfg.warmup_runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*input_sets[i % len(input_sets)])
        enqueue_us.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    spin_us = min(2 * statistics.median(enqueue_us) + 20, 5000) if hide_launch else 0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples, wall, rechecked = [], [], 0
    gen = torch.Generator().manual_seed(1234)
    began = time.perf_counter()
    while not stop(samples, cfg, time.perf_counter() - began):
        inputs = input_sets[len(samples) % len(input_sets)]
        flush.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if spin_us:
            torch.cuda._sleep(int(spin_us * SPIN_CYCLES_PER_US))
        start.record()
        out = fn(*inputs)
        end.record()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3 - spin_us / 1e3)
        samples.append(start.elapsed_time(end))
        if recheck is not None and torch.rand((), generator=gen).item() < cfg.recheck_fraction:
            recheck(inputs, out)
            rechecked += 1
    result = summarize(samples, wall)
    result.update(
        {"l2_flush_bytes": flush.numel() * 4, "persisting_l2_reset": l2_reset, "rechecked": rechecked, "spin_us": spin_us}
    )
    return result


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


def time_cpu(
    fn: Callable[..., Any],
    input_sets: Sequence[Sequence[Any]],
    cfg: TimingConfig,
    recheck: Optional[Callable[[Sequence[Any], Any], None]] = None,
) -> Dict[str, Any]:
    """Host timer for the CPU path (Triton interpreter): the same stopping rule, a short time bound."""
    fn(*input_sets[0])
    samples: List[float] = []
    began = time.perf_counter()
    bound = TimingConfig(cfg.min_runs, cfg.max_runs, cfg.rel_err, min(cfg.max_time_s, 2.0))
    while not stop(samples, bound, time.perf_counter() - began):
        inputs = input_sets[len(samples) % len(input_sets)]
        t0 = time.perf_counter()
        out = fn(*inputs)
        samples.append((time.perf_counter() - t0) * 1e3)
        if recheck is not None and len(samples) == 1:
            recheck(inputs, out)
    return summarize(samples, samples)
