"""The baselines' timing stage: eager, torch.compile and the deck's others timed in the referee before the candidate
exists, by the batches and the stopping rule the candidate's runner is timed by, each behind a quiet-host gate on GPUs."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from kbsweep.grader.referee import checks, reference_timers
from kbsweep.grader.referee.candidate import CandidateContext
from kbsweep.grader.referee.host_load import HostBusy, QuietHost
from kbsweep.grader.referee.request import RefereeRequest
from kbsweep.grader.shared import profiling, timing
from kbsweep.grader.shared.arena import clone
from kbsweep.grader.shared.failures import GradeFailure, one_line
from kbsweep.grader.shared.modules import load_module
from kbsweep.outcomes import Outcome


class BaselineStage(CandidateContext):
    """The baselines timed here, on the timer the candidate's batches run on."""

    def timing_mode(self) -> str:
        """How batches are timed, the baselines' and the candidate's alike (:func:`kbsweep.grader.shared.timing.run_batch`)."""
        if self.device.type != "cuda":
            return "host"
        return "isolated" if self.spec.get("regime") == "latency" else "back_to_back"

    def replays(self, mode: str, kernelbench: bool = False) -> bool:
        """Whether back-to-back batches alternate with graph replays (never for KernelBench's metrics: eager)."""
        return mode == "back_to_back" and self.cfg.replay and not kernelbench

    def time_baselines(self, shape: Dict[str, Any], deadline: float) -> Dict[str, Any]:
        ref_model = self.build(shape, 42)
        first = self.inputs(shape, 2026)
        sets = [first] + [self.inputs(shape, 2026 + i) for i in range(1, self.set_count(first))]
        return time_baselines(
            self.req, ref_model, sets, lambda: self.any_rank(time.perf_counter() > deadline), self.time_quietly
        )

    @functools.cached_property
    def quiet_host(self) -> QuietHost:
        """The gate a baseline's timing waits at (:mod:`~kbsweep.grader.referee.host_load`), on GPUs only: on a CPU
        the grade's own timing shares the cores by design. Its wait is at most half the baseline budget, so that a
        busy host ends the grade as a node failure before the grade's own time limit (a timeout is the model's)."""
        limit = self.cfg.quiet_cpus if self.device.type == "cuda" else None
        return QuietHost(limit, min(self.cfg.quiet_wait_s, self.req.baseline_budget_s / 2), self.any_rank)

    def time_quietly(self, name: str, fn: Callable, sets: List[List[Any]]) -> Dict[str, Any]:
        """:meth:`time_with_timers` while the host is quiet, the other processes' CPUs meanwhile beside it. A host
        that stays busy fails the grade as a ``node_failure`` (infra: never a score, retried), never a baseline
        timed under load."""
        try:
            timed, others = self.quiet_host.time(f"baseline {name}", lambda: self.time_with_timers(fn, sets))
        except HostBusy as busy:
            raise GradeFailure(Outcome.NODE_FAILURE, str(busy)) from None
        return {**timed, "host_others_cpus": None if others is None else round(others, 2)}

    def time_with_timers(self, fn: Callable, sets: List[List[Any]]) -> Dict[str, Any]:
        """kbsweep's figure (:meth:`time_here`, the scored one) and beside it, under ``timers``, each other timer the
        request names (``kernelbench``: :func:`~kbsweep.grader.referee.reference_timers.time_kernelbench` on the first input set)."""
        timed = self.time_here(fn, sets)
        others = {name: getattr(reference_timers, f"time_{name}")(fn, sets[0], self.device) for name in self.req.timers}
        return {**timed, "timers": others} if others else timed

    def time_here(self, fn: Callable, sets: List[List[Any]]) -> Dict[str, Any]:
        """A trusted callable timed in this process by the same batches the candidate's runner uses, alternating
        with replays of the same calls where they can be captured, the scored figure chosen by the same rule."""
        mode = self.timing_mode()
        flush = timing.L2Flush(self.req.l2_bytes) if mode != "host" else None
        align = timing.call_barrier(self.barrier, mode)
        steps = lambda n, call=fn: [(align, lambda i=i: call(*sets[i % len(sets)]), lambda out: None) for i in range(n)]  # noqa: E731
        shape_ = self.agreed_batch(
            timing.calibrate_batch(
                lambda spin_us: timing.run_batch(steps(3), mode, spin_us, flush), mode != "back_to_back", mode == "host"
            )
        )
        warm, per_batch = int(shape_.get("warm_calls", 0)), int(shape_["per_batch"])  # as the candidate's batches open
        replays, refused = None, None
        if flush is not None and self.replays(mode):  # replays are back to back, on a GPU
            try:
                replays = (
                    timing.Replay(steps(per_batch), flush),
                    timing.Replay(steps(per_batch, lambda *a: None), flush),
                )
            except Exception as exc:  # noqa: BLE001 - a baseline a graph cannot hold is timed by events alone
                refused = f"capture failed: {one_line(exc)}"

        def alternation(session) -> tuple:
            """Batches until timing.baseline_done ends them, events, replay, events...: (events' summary, replays' summary or None)."""
            samples: List[float] = []
            replayed: List[float] = []
            began, elapsed = time.perf_counter(), 0.0
            while not timing.baseline_done(samples, replayed, self.cfg, elapsed, replays is not None, per_batch):
                if replays and len(samples) > len(replayed) * per_batch:
                    unrecorded = lambda: profiling.kernels_unrecorded(session)  # noqa: E731
                    full = timing.run_batch(steps(warm), mode, shape_["replay_spin_us"], flush, replays[0], unrecorded)[
                        "replay_ms"
                    ]
                    bare = timing.run_batch([], mode, replay=replays[1], unrecorded=unrecorded)["replay_ms"]
                    replayed.append(timing.replay_sample(full, bare, per_batch))
                    elapsed = time.perf_counter() - began
                    continue
                ms, elapsed = self.slowest(
                    timing.run_batch(steps(warm + per_batch), mode, shape_["spin_us"], flush)["ms"],
                    time.perf_counter() - began,
                )
                samples += ms[warm:]
            return timing.summarize(samples), timing.summarize(replayed) if replayed else (
                {"error": refused} if refused else None
            )

        # under the profiler the runner keeps on over the candidate's calls: CUPTI's cost per kernel (1.4% of a
        # 4096³ GEMM in a graph on the H200) is then in both sides of a speedup; replays run without it there and here
        with profiling.profiled(self.device) as session, timing.ClockSampler(self.device) as clocks:
            events, replay = alternation(session)
        return {
            **(timing.scored(events, replay) if mode == "back_to_back" else events),
            "mode": mode,
            "per_batch": per_batch,
            "warm_calls": warm,
            "clocks": clocks.summary(),
        }


def time_baselines(
    request: RefereeRequest, ref_model: Any, sets: List[List[Any]], spent: Callable[[], bool], timer: Callable
) -> Dict[str, Any]:
    """Eager, torch.compile, SOTA... of ``request`` timed by ``timer(name, fn, sets)``; one that would start once
    ``spent()`` says the grade's baseline budget is gone (a slow compile must not cost the candidate its grade) is
    left for a later grade. Each but eager is first compared with the reference: one outside the tolerance is timed all the
    same (a library's own precision) and carries ``outside_tolerance``."""
    spec = request.spec
    out: Dict[str, Optional[Dict[str, Any]]] = {}
    expected = None  # the reference's output on the first timing inputs, once for every baseline checked against it
    for name in request.baselines:
        if name in spec.get("skip_baselines", {}):
            out[name] = {"skipped": spec["skip_baselines"][name]}
            continue
        if spent():
            out[name] = {"error": "not timed: the grade's baseline budget was spent", "retry": True}
            continue
        try:
            fn = baseline_callable(name, ref_model, Path(request.reference), request.compile_mode)
            if fn is None:
                out[name] = None
                continue
            differs, began = None, time.perf_counter()
            if name != "eager":  # eager is the reference itself
                expected = ref_model(*clone(sets[0])) if expected is None else expected
                try:
                    checks.compare(expected, fn(*clone(sets[0])), spec["tolerance"])
                except checks.CheckFailure as exc:
                    differs = str(exc)
            checked = time.perf_counter()  # a compile baseline compiled in its check's first call
            timed = timer(name, fn, sets)
            timed["cost_s"] = {"check": round(checked - began, 3), "timing": round(time.perf_counter() - checked, 3)}
            if differs:
                timed["outside_tolerance"] = differs
            out[name] = timed
        except GradeFailure:  # the host's, not the baseline's: the grade ends
            raise
        except Exception as exc:  # a baseline failing is recorded, never the candidate's fault
            out[name] = {"error": one_line(exc)}
    return out


def baseline_callable(name: str, ref_model: Any, reference: Path, compile_mode: Optional[str]) -> Optional[Callable]:
    """The baseline ``name`` as a callable over the reference model, or None where the deck has none."""
    if name == "eager":
        return ref_model
    if name == "compile":
        return torch.compile(ref_model, mode=compile_mode or None)
    if name in ("sota", "baseline"):
        path = reference.with_name(f"{name}.py")
        if not path.exists():
            return None
        module = load_module(f"kbsweep_{name}", path)
        if name == "baseline":
            return module.Baseline(ref_model)
        return (lambda *a: module.sota_forward(ref_model, *a)) if module.is_available() else None
    raise ValueError(f"unknown baseline {name}")
