"""Timing: the batch loop the referee drives in the candidate's runner and runs itself for baselines.

The scored figure of a candidate's batch is the referee's (:mod:`kbsweep.grader.referee.timing_stage`): its own clock
around the batch, less a null it measured without the candidate, over the batch's calls (:func:`referee_sample`).
The runner's per-call figures from :func:`run_batch` are evidence. GPU, back to back: each call between CUDA events
after a read flush of the L2, the batch opened by warm calls (a command of their own) that bring the chip to the
clock it sustains under the load; where the calls can be captured, batches alternate with replays of a CUDA graph
of the same calls (:class:`Replay`), and the replays are scored (:func:`scored`). GPU, isolated (latency-regime
problems): a full sync around each call, launches included. CPU: perf_counter around each call (plumbing, not
performance). NVML samples the clocks of every pass.

Stopping rules. The candidate's (GPU MODE's, :func:`stop`): at least ``min_runs`` calls, then stop when the relative
standard error of the mean is under ``rel_err``, or ``max_time_s`` of measured time, or ``max_runs`` calls. A baseline's
on GPUs (:func:`baseline_done`): once its scored median is known to ``ci_rel`` (the 95 % interval's half-width over the
median), or ``max_time_s``. The score uses the median.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import math
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

CUDA_LIMIT_PERSISTING_L2 = 0x06
SPIN_CYCLES_PER_US = 2000  # about the SM clock of a Hopper under load; a longer spin is harmless
BATCH_ENQUEUE_US = 50_000  # host time to enqueue one back-to-back batch
MAX_BATCH_SPIN_US = 100_000
# Calls per back-to-back batch, at most: the referee's clock reads a batch whole, so its jitter (tens of
# microseconds a batch) is divided by the calls; small calls get many of them (each on an input set of its own,
# within the grade's memory budget: candidate.calls_cap)
MAX_BATCH_CALLS = 256
SYNCED_BATCH_CALLS = 8  # calls per batch where the host waits for each call (isolated, host)
# Untimed calls that open every back-to-back batch of a call of WARM_FROM_US or more, for WARM_US of GPU work: the
# chip's power controller then holds the clock it sustains under this load (a bf16 GEMM at 8192^3 on the H200 read
# 1.39 ms at the 1980 MHz boost after the host gaps between batches, 1.52 ms at the ~1600 MHz its power cap holds
# under do_bench or graph replay). Below WARM_FROM_US a batch's enqueue, not power, sets the pace.
WARM_US, WARM_FROM_US, MAX_WARM_CALLS = 80_000, 100, 64
# each replay batch runs on one fresh draw of the inputs, and its calls share it: a call whose time follows the
# draw needs several draws for a median that holds still (paged attention batch 32 on the H200: 0.817-0.849 ms
# over five draws, 0.3% over five placements of one draw; stopping at min_runs (3) replays, three grades read
# 0.821-0.853 ms)
MIN_REPLAYS = 10
REPLAY = torch.cuda.CUDAGraph.replay  # the harness's own replays, taken before the kernel gate counts the candidate's


@dataclass
class TimingConfig:
    """When a shape's timing stops (:func:`stop`): ``config.yaml``'s ``grade.timing``."""

    min_runs: int = 3  # calls, at least
    max_runs: int = 100  # calls, at most
    rel_err: float = 0.001  # the mean's standard error over the mean, enough to stop once below
    max_time_s: float = 10.0  # seconds of a shape's timed batches, at most (then it stops whatever the error)
    replay: bool = True  # back to back on one GPU: score a CUDA-graph replay of the calls where they can be captured
    quiet_cpus: Optional[float] = (
        1.0  # on GPUs, a baseline is timed while other processes use at most this many of the referee's CPUs (None: any load)
    )
    quiet_wait_s: float = 600.0  # a grade's wait for that, at most; then the grade is a node_failure (infra, retried)
    ci_rel: Optional[float] = (
        0.01  # a baseline stops once its median's 95 % interval is within this of it (None: the candidate's rule)
    )


def median_ci95(samples_ms: List[float]) -> List[float]:
    """The median's 95 % interval, no distribution assumed: the order statistics x(j) and x(n+1-j), j the largest
    count with P(Binomial(n, 1/2) < j) <= 2.5 % (the whole range where n is too small for that: n < 6). A call's
    times are skewed (a slow tail), so the mean's interval may miss the median the score uses."""
    ordered, n = sorted(samples_ms), len(samples_ms)
    # exact integers, C(n, j) updated step to step: a fresh C(n, j) / 2**n each step took 6.9 CPU-s at n = 10 000
    below, term, j = 0, 1, 0
    while (below + term) * 40 <= 1 << n:  # P(Binomial(n, 1/2) <= j) <= 1/40
        below += term
        term = term * (n - j) // (j + 1)
        j += 1
    j = max(j, 1)
    return [ordered[j - 1], ordered[n - j]]


def summarize(samples_ms: List[float]) -> Dict[str, Any]:
    """The samples' median (the scored figure) with its 95 % interval, and their mean, spread and extremes."""
    n = len(samples_ms)
    quartiles = statistics.quantiles(samples_ms, n=4) if n > 1 else [samples_ms[0]] * 3
    return {
        "median_ms": statistics.median(samples_ms),
        "ci95_ms": median_ci95(samples_ms),
        "mean_ms": statistics.fmean(samples_ms),
        "std_ms": statistics.stdev(samples_ms) if n > 1 else 0.0,
        "min_ms": min(samples_ms),
        "iqr_ms": quartiles[2] - quartiles[0],
        "runs": n,
    }


def loaded_library(stem: str) -> Optional[str]:
    """Path of a shared library already mapped into this process (the one torch itself uses)."""
    with open("/proc/self/maps") as fh:
        for line in fh:
            path = line.split()[-1]
            if f"/{stem}" in path and ".so" in path:
                return path
    return None


def persisting_l2_limit() -> Optional[int]:
    """cudaDeviceGetLimit(cudaLimitPersistingL2CacheSize) through the process's libcudart, or None."""
    path = loaded_library("libcudart")
    if path is None:
        return None
    value = ctypes.c_size_t(0)
    status = ctypes.CDLL(path).cudaDeviceGetLimit(ctypes.byref(value), CUDA_LIMIT_PERSISTING_L2)
    return int(value.value) if status == 0 else None


def reset_persisting_l2() -> bool:
    """Set the persisting-L2 limit to 0 and reset persisting lines (defeats L2-persistence carve-outs)."""
    try:
        lib = ctypes.CDLL("libcudart.so")
    except OSError:
        import glob
        import os

        candidates = glob.glob(
            os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcudart.so*")
        )
        if not candidates:
            return False
        lib = ctypes.CDLL(candidates[0])
    ok = lib.cudaDeviceSetLimit(CUDA_LIMIT_PERSISTING_L2, ctypes.c_size_t(0)) == 0
    return ok and lib.cudaCtxResetPersistingL2Cache() == 0


# Host (CPU) figures check the plumbing, not performance: the default rule's 0.1% standard error is never met under
# an interpreter, so a CPU grade timed 104 calls per shape and callable (a demo grade: 40 s, 21 s with this cap, loaded).
HOST_MAX_RUNS, HOST_MAX_TIME_S = 16, 1.0  # two host batches of 8 calls
# A KernelBench problem's CPU grade: one host batch. Its forwards are whole models (a conv at the smoke sizes takes
# 0.1-1 s a call), and these figures only show the timed path works: KernelBench's metrics come from GPUs.
KERNELBENCH_HOST_RUNS = 8


def for_device(cfg: TimingConfig, device_type: str, host_runs: int = HOST_MAX_RUNS) -> TimingConfig:
    """``cfg`` as it applies on ``device_type``: capped at ``host_runs`` calls and HOST_MAX_TIME_S off GPUs."""
    if device_type == "cuda":
        return cfg
    return dataclasses.replace(
        cfg,
        max_runs=min(cfg.max_runs, max(host_runs, cfg.min_runs)),
        max_time_s=min(cfg.max_time_s, HOST_MAX_TIME_S),
        ci_rel=None,
    )  # host baselines stop by the call count too: their figures are plumbing


def stop(samples: List[float], cfg: TimingConfig, elapsed_s: float, calls: int = 1) -> bool:
    """Whether a shape's timing may end, each sample standing for ``calls`` calls (a batch's figure)."""
    n = len(samples) * calls
    if n < cfg.min_runs or not samples:
        return False
    if n >= cfg.max_runs or elapsed_s > cfg.max_time_s:
        return True
    mean = statistics.fmean(samples)
    return len(samples) > 1 and statistics.stdev(samples) / math.sqrt(len(samples)) / mean < cfg.rel_err


# The fewest samples whose whole range is a 95 % interval of their median: 1 - 2 * 2**-6 = 96.9 % (five: 93.8 %)
CI_MIN_SAMPLES = 6


def precise(samples: List[float], ci_rel: float, least: int = CI_MIN_SAMPLES) -> bool:
    """Whether ``samples``' median is known to ``ci_rel``: at least ``least`` of them, and the half-width of the median's
    95 % interval (:func:`median_ci95`) at most ``ci_rel`` of the median."""
    if len(samples) < max(least, 1):
        return False
    low, high = median_ci95(samples)
    return (high - low) / 2 <= ci_rel * statistics.median(samples)


def baseline_done(
    events: List[float], replayed: List[float], cfg: TimingConfig, elapsed_s: float, replaying: bool, calls: int = 1
) -> bool:
    """Whether a baseline's timing may end: its scored samples (``replayed`` where its calls were captured, each a
    replay of ``calls`` calls; else ``events``, a call each) :func:`precise` to ``cfg.ci_rel`` over at least
    ``min_runs`` calls, or ``max_time_s`` spent (the hard cap). Its replays run on the same input sets each time,
    so MIN_REPLAYS (fresh draws) does not apply. ``ci_rel`` None (host grades): the candidate's rule."""
    if cfg.ci_rel is None:
        return stop(events, cfg, elapsed_s) and not (replaying and replays_short(replayed, cfg))
    scored_, per_sample = (replayed, calls) if replaying else (events, 1)
    if scored_ and elapsed_s > cfg.max_time_s:
        return True
    return len(scored_) * per_sample >= cfg.min_runs and precise(scored_, cfg.ci_rel)


def referee_sample(wall_ms: float, null_ms: float, calls: int) -> float:
    """One call's time from the referee's clock: a batch's wall time less the null the referee measured without
    the candidate (everything but the calls), over its calls."""
    return max(wall_ms - null_ms, 1e-6) / max(calls, 1)


class L2Flush:
    """Evicts the L2 by *reading* a buffer of 2x its size: the lines it leaves behind are clean, so the timed
    call pays no write-back of the flush's own data (a ``zero_()`` flush leaves a full L2 of dirty lines)."""

    def __init__(self, l2_bytes: int):
        self.buffer = torch.ones(max(2 * l2_bytes, 1 << 20) // 4, dtype=torch.int32, device="cuda")
        self.sink = torch.zeros((), dtype=torch.int64, device="cuda")

    def __call__(self) -> None:
        torch.sum(self.buffer, dim=0, out=self.sink)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * 4


def input_set_count(set_bytes: int, l2_bytes: int, max_bytes: int = 8 << 30) -> int:
    """Distinct input sets a timed batch rotates over: enough to exceed 3x the L2 (none on CPU: ``l2_bytes`` 0)."""
    wanted = math.ceil(3 * l2_bytes / max(set_bytes, 1))
    return max(1, min(wanted, 32, int(max_bytes // max(set_bytes, 1))))


class ClockSampler:
    """NVML's view of the GPU while a pass runs: SM clock, power and the reasons the clock is held down, sampled
    every ``interval_s`` on a thread (NVML reads take tens of microseconds and release the GIL). The evidence
    that tells a power-capped figure from a boosted one; empty where NVML cannot read the device (CPU, no NVML)."""

    REASONS = {
        0x1: "gpu_idle",
        0x2: "applications_clocks",
        0x4: "sw_power_cap",
        0x8: "hw_slowdown",
        0x20: "sync_boost",
        0x40: "sw_thermal",
        0x80: "hw_thermal",
        0x100: "hw_power_brake",
        0x200: "display_clocks",
    }

    def __init__(self, device: Any, interval_s: float = 0.005):
        self.interval_s, self.handle = interval_s, None
        self.samples: List[Tuple[int, float, int]] = []  # (SM clock MHz, power W, throttle reasons)
        self.stopped = threading.Event()
        if getattr(device, "type", device) == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml = pynvml
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda._get_nvml_device_index(device))
            except Exception:  # noqa: BLE001 - no NVML here (a VM without it, a driver mismatch): no evidence, no failure
                self.handle = None

    def __enter__(self) -> "ClockSampler":
        if self.handle is not None:
            self.thread = threading.Thread(target=self.sample, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.handle is not None:
            self.stopped.set()
            self.thread.join()

    def sample(self) -> None:
        nvml = self.nvml
        while not self.stopped.wait(self.interval_s):
            try:
                self.samples.append(
                    (
                        nvml.nvmlDeviceGetClockInfo(self.handle, nvml.NVML_CLOCK_SM),
                        nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3,
                        nvml.nvmlDeviceGetCurrentClocksEventReasons(self.handle),
                    )
                )
            except Exception:  # noqa: BLE001 - a read NVML refuses ends the sampling, not the grade
                return

    def summary(self) -> Dict[str, Any]:
        if not self.samples:
            return {}
        clocks, watts, reasons = zip(*self.samples)
        held = {
            name: sum(1 for r in reasons if r & bit) / len(reasons)
            for bit, name in self.REASONS.items()
            if any(r & bit for r in reasons)
        }
        return {
            "samples": len(clocks),
            "sm_mhz": {"min": min(clocks), "median": statistics.median(clocks), "max": max(clocks)},
            "power_w": {"median": statistics.median(watts), "max": max(watts)},
            "reasons": held,
        }


def run_batch(
    steps: Sequence[tuple],
    mode: str,
    spin_us: float = 0.0,
    flush: Optional["L2Flush"] = None,
    replay: Optional["Replay"] = None,
    unrecorded: Callable[[], Any] = contextlib.nullcontext,
) -> Dict[str, Any]:
    """Time one batch of calls. Each step is (before, call, after): ``before()`` prepares the call's inputs,
    ``call()`` is the timed interval, ``after(out)`` takes its output; the latter two run outside the interval.
    ``mode``: back_to_back (GPU: every call queued behind one spin, so host enqueue stays outside the events),
    isolated (GPU: a full sync around each call; the launches are in the figure) or host (CPU: perf_counter).
    ``replay`` (back to back): queued after the steps, one event pair around it (``replay_ms``), inside
    ``unrecorded()`` (:func:`kbsweep.grader.shared.profiling.kernels_unrecorded`). ``loop_ms``: the whole batch by the
    host's clock, its end synced."""
    if mode == "host":
        began, ms = time.perf_counter(), []
        for before, call, after in steps:
            before()
            t0 = time.perf_counter()
            out = call()
            ms.append((time.perf_counter() - t0) * 1e3)
            after(out)
        return {"ms": ms, "enqueue_us": [], "loop_ms": (time.perf_counter() - began) * 1e3}
    entered = time.perf_counter()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(len(steps) + 1)
    ]
    enqueue_us = []
    torch.cuda.synchronize()
    began = time.perf_counter()
    if mode == "back_to_back" and spin_us:
        torch.cuda._sleep(int(spin_us * SPIN_CYCLES_PER_US))
    for (before, call, after), (start, end) in zip(steps, events):
        t0 = time.perf_counter()
        before()
        if flush is not None:
            flush()
        if mode == "isolated":
            torch.cuda.synchronize()
        start.record()
        out = call()
        end.record()
        after(out)
        if mode == "isolated":
            torch.cuda.synchronize()
        enqueue_us.append((time.perf_counter() - t0) * 1e6)
    if replay is not None:
        with unrecorded():
            events[-1][0].record()
            REPLAY(replay.graph)
            events[-1][1].record()
    torch.cuda.synchronize()
    synced = time.perf_counter()
    timed = {
        "ms": [start.elapsed_time(end) for start, end in events[: len(steps)]],
        "enqueue_us": enqueue_us,
        "loop_ms": (synced - began) * 1e3,
    }
    if replay is not None:
        timed["replay_ms"] = events[-1][0].elapsed_time(events[-1][1])
    # the host's monotonic clock (one for every process here): where a batch's wall goes outside its loop
    timed["stamps"] = [entered, began, synced, time.perf_counter()]
    return timed


class Replay:
    """A batch's calls captured as one CUDA graph, each ``before(); flush(); after(call())`` as an event-timed batch
    runs them, for :func:`run_batch` to replay. ``key``: the plan it was captured for (a later batch of the same
    plan replays it). Raises what the capture raised: a call that syncs the host, allocates outside torch or
    launches on a stream of its own cannot be captured, and is then timed by events alone."""

    def __init__(self, steps: Sequence[tuple], flush: "L2Flush", key: Any = None):
        self.key, self.calls, self.steps, self.flush = (
            key,
            len(steps),
            list(steps),
            flush,
        )  # the graph reads what they hold
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        # a capture that fails ends before torch closes it on the CUDA generator, whose every later draw then
        # raises "Offset increment outside graph capture" (on the H200: the next shape's inputs, after a reference
        # that syncs failed its capture); the generator gets back the state it had before
        generator = torch.cuda.default_generators[torch.cuda.current_device()]
        untouched = generator.clone_state()
        try:
            with torch.cuda.graph(self.graph):
                for before, call, after in steps:
                    before()
                    flush()
                    after(call())
        except BaseException:
            torch.cuda.synchronize()
            generator.graphsafe_set_state(untouched)
            raise
        REPLAY(self.graph)  # the first launch uploads the graph: never inside a timed replay
        torch.cuda.synchronize()


def events_claim(ms: Sequence[float], loop_ms: Optional[float], null_loop_ms: float, calls: int) -> float:
    """The runner's own account of an event-timed batch's call, in the terms of the referee's figure: its loop's
    wall (first step to the last sync, by its clock) less the referee's null loop, a call; or the calls' mean GPU
    time, if more. Where the host is as slow as the GPU or slower (launch-bound calls: the GPU waits between them),
    the events see only the kernels while both walls see the loop. Evidence only: a report raised gains nothing."""
    gpu = statistics.fmean(ms)
    return gpu if loop_ms is None else max(gpu, (loop_ms - null_loop_ms) / max(calls, 1))


def replay_sample(replay_ms: float, bare_ms: float, calls: int) -> float:
    """One call's time from a replay of ``calls`` calls and a replay of the same without them (flushes, output
    copies): what the calls added, per call (a graph-amortized figure)."""
    return (replay_ms - bare_ms) / max(calls, 1)


def scored(events: Optional[Dict[str, Any]], replay: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The scored figure of a back-to-back shape: the replays' where the calls were captured (a graph replay is one
    launch, so the figure is the calls' GPU time, graph-amortized), else the event-timed batches'. Returns the chosen
    summary with ``timer`` ("replay" or "events") and both summaries beside it."""
    captured = replay is not None and "median_ms" in replay
    chosen = replay if captured else events
    figure = {**(chosen or {}), "timer": "replay" if captured else "events", "events": events}
    if replay is not None:
        figure["replay"] = replay
    if replay is not None and not captured:
        figure["replay_refused"] = replay.get("error")
    return figure


def replays_short(replayed: List[float], cfg: TimingConfig) -> bool:
    """Whether a shape that alternates with replays needs more of them before its timing may stop."""
    return len(replayed) < max(cfg.min_runs, MIN_REPLAYS)


def call_barrier(barrier: Optional[Callable[[], None]], mode: str) -> Callable[[], None]:
    """What ranks run before each call of a batch: ``barrier`` where the host waits for every call (host,
    isolated), so they start it together; nothing back to back, where the calls queue behind one spin."""
    return barrier if barrier is not None and mode != "back_to_back" else (lambda: None)


def calibrate_batch(
    run: Callable[[float], Dict[str, List[float]]], latency: bool, host: bool = False
) -> Dict[str, float]:
    """:func:`batch_shape` from two warm-up batches of ``run(spin_us)``: one without a spin for the host's
    enqueue time, one behind a spin covering that for the GPU time (without it, launch latency would be in it).
    ``host``: no warm-up batch; a latency batch's shape is fixed, and host figures check the plumbing only."""
    if host:
        return batch_shape({}, True)
    first = run(0.0)
    if latency:
        return batch_shape(first, True)
    second = run(1.5 * len(first["enqueue_us"]) * statistics.median(first["enqueue_us"] or [1.0]) + 1000)
    return batch_shape({"enqueue_us": first["enqueue_us"], "ms": second["ms"]}, False)


def warm_calls_for(gpu_us: float) -> int:
    """The warm calls a back-to-back batch of calls of ``gpu_us`` each opens with (none below WARM_FROM_US)."""
    return min(MAX_WARM_CALLS, math.ceil(WARM_US / gpu_us)) if gpu_us >= WARM_FROM_US else 0


def batch_shape(warm: Dict[str, List[float]], latency: bool) -> Dict[str, Any]:
    """Calls per back-to-back batch and the spin in front of them, from a warm-up batch's host enqueue time and
    GPU time per call. The spin covers only what the host would fall behind by (enqueue beyond GPU time, with
    margin, plus 1 ms): a GPU-bound batch then runs without idle gaps, at the clocks a loaded chip sustains,
    where a spin much longer than the work would hand it the power headroom of an idle chip (a bf16 GEMM at
    8192^3 read 7-13% fast on the H200 behind a spin of twice the batch's enqueue time)."""
    if latency:
        return {"per_batch": SYNCED_BATCH_CALLS, "warm_calls": 0, "spin_us": 0.0, "mode": "isolated"}
    enqueue_us = statistics.median(warm.get("enqueue_us") or [1.0])
    gpu_us = statistics.median(warm.get("ms") or [0.0]) * 1e3
    per_batch = int(max(2, min(MAX_BATCH_CALLS, BATCH_ENQUEUE_US / max(enqueue_us, gpu_us, 1.0))))
    warm_calls = warm_calls_for(gpu_us)
    behind_us = max(enqueue_us - gpu_us, 0.0)  # a call's
    spin_us = lambda calls: min(1.5 * calls * behind_us + 1000, MAX_BATCH_SPIN_US)  # noqa: E731
    # a replay batch enqueues its warm calls one by one and the timed ones as one graph
    return {
        "per_batch": per_batch,
        "warm_calls": warm_calls,
        "spin_us": spin_us(warm_calls + per_batch),
        "replay_spin_us": spin_us(warm_calls),
        "mode": "back_to_back",
    }
