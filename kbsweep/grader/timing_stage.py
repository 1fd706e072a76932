"""The timing stage: the candidate timed in its runner by batches whose every output is checked and whose figures
the referee's clock corroborates, and the baselines timed here by the same batches before the candidate exists.
The timer itself (batches, flushes, the stopping rule) is :mod:`kbsweep.grader.timing`, for every rank alike."""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from kbsweep.grader import checks, timing
from kbsweep.grader.arena import apply_swaps, clone, encode, nbytes, prepared_swaps
from kbsweep.grader.candidate import CandidateContext, load_module
from kbsweep.grader.failures import GradeFailure, one_line
from kbsweep.grader.request import RefereeRequest
from kbsweep.outcomes import Outcome

PICKS = 2  # calls of each timed batch whose outputs are compared with the reference after it
SWAPS = 4  # canary pairs per float input and call
# The referee's clock against the runner's figures, per timing mode: the batch's wall time, less what the
# referee measured of everything else it contains (spin, flushes, output copies, the channel's round trip) and a
# slack, over the runner's summed call times; past this ratio (median over batches) the runner's figures are
# not believed.
BAND = {"back_to_back": 1.15, "isolated": 1.5, "host": 1.5}


class TimingStage(CandidateContext):
    """The candidate's batches there and the baselines' here, on one timer; the referee's clock against the figures."""

    def timing_mode(self) -> str:
        if self.device.type != "cuda":
            return "host"
        return "isolated" if self.spec.get("regime") == "latency" else "back_to_back"

    def kernelbench_timing(self, baselines: List[Dict[str, Any]]) -> Dict[str, Any]:
        """A candidate KernelBench's eval calls correct and kbsweep's checks failed, timed for KernelBench's metrics
        only: by kbsweep's timer (the referee's clock still corroborates it), its outputs taken as KernelBench takes
        them and not compared (KernelBench checks nothing while it times). kbsweep's verdict stays failed."""
        self.stage, self.tag = "kernelbench_timing", "/kernelbench_timing"
        before = len(self.findings)
        try:
            entry = self.time_shape(self.req.shapes[0], kernelbench=True)
        except GradeFailure as exc:  # it crashed or hung while timed: no figure, the grade's failure stands
            return {"error": str(exc)[:300]}
        entry["findings"], self.findings[before:] = self.findings[before:], []  # this timing's, not the grade's
        entry["baselines"] = baselines[0] if baselines else {}
        return entry

    def time_shape(self, shape: Dict[str, Any], kernelbench: bool = False) -> Dict[str, Any]:
        """The candidate timed there, batch by batch, on fresh inputs with per-call canaries; after each batch
        every output slot must be written and the outputs of calls picked now must match the reference
        (``kernelbench``: outputs as KernelBench takes them, nothing compared, no graph figure)."""
        self.shape = shape
        self.open_arena(self.arena_size(shape))
        ref_model = self.build(shape, 42)
        model = self.send_model(ref_model, shape, 42)
        template = self.inputs(shape, 2026)
        expected = self.first_output(shape)
        sets = [encode(template, self.arena) for _ in range(self.set_count(template))]
        mode = self.timing_mode()
        calls = self.calls_cap(sum(nbytes(t) for t in checks.as_tuple(expected)))
        warm_slots = [self.output_slots(expected) for _ in range(3)]
        shape_ = self.agreed_batch(timing.calibrate_batch(
            lambda spin_us: self.batch(ref_model, model, shape, sets, warm_slots, mode, spin_us, check=False, kernelbench=kernelbench),
            mode != "back_to_back", mode == "host"))
        per_batch, warm = min(int(shape_["per_batch"]), calls), int(shape_.get("warm_calls", 0))
        slots = [warm_slots[i % len(warm_slots)] for i in range(warm)] + [self.output_slots(expected) for _ in range(per_batch)]
        overhead = self.overheads(model, template, sets, expected, mode, shape_["spin_us"], warm + per_batch)
        samples: List[float] = []
        ratios: List[float] = []
        shares: List[float] = []  # of the batch's wall time, what the calls claim: how much of it the ratio can see
        began, elapsed = time.perf_counter(), 0.0
        with timing.ClockSampler(self.device) as clocks:
            while not timing.stop(samples, self.cfg, elapsed):
                batch = self.batch(ref_model, model, shape, sets, slots, mode, shape_["spin_us"], check=not kernelbench, warm=warm,
                                   kernelbench=kernelbench)
                ms, elapsed = self.slowest(batch["ms"], time.perf_counter() - began)
                samples += ms[warm:]
                # this process's clock against the figures; across ranks each call lasts as long as its slowest rank
                # on every rank (they wait for each other), and one rank's low figures cannot lower that maximum
                ratios.append((batch["wall_ms"] - overhead["total_ms"]) / max(sum(ms), 1e-9))
                shares.append(sum(ms) / max(batch["wall_ms"], 1e-9))
        timed = {**timing.summarize(samples, samples), "mode": mode, "per_batch": per_batch, "warm_calls": warm, "batches": len(ratios),
                 "spin_us": shape_["spin_us"], "input_sets": len(sets), "clocks": clocks.summary()}
        ratio = statistics.median(ratios)
        timed["corroboration"] = {**overhead, "wall_over_claimed": ratio, "max_ratio": max(ratios), "band": BAND[mode],
                                  "claimed_share_of_wall": statistics.median(shares)}
        if ratio > BAND[mode]:
            self.findings.append({"kind": "time_disagreement", "shape": shape,
                                  "detail": f"{shape}: the referee's clock saw {ratio:.2f}x the time the candidate's process reported"})
        entry: Dict[str, Any] = {"shape": shape, "input_sets": len(sets), "candidate": timed, "baselines": {}}
        # no graph figure across ranks: a rank whose capture fails would strand its peers in a captured collective
        if mode != "host" and (mode == "isolated" or timed["median_ms"] < 0.05) and self.req.world_size == 1 and not kernelbench:
            graph = self.ask("graph", model=model, inputs=sets[0]).get("graph_ms")
            timed["graph_ms"] = float(graph) if isinstance(graph, (int, float)) else None
        return entry

    def batch(self, ref_model, model: int, shape, sets, slots, mode: str, spin_us: float, check: bool = True, warm: int = 0,
              kernelbench: bool = False) -> Dict[str, Any]:
        """One timed batch there: the plan (slots, canaries) sent when the runner is armed, fresh inputs written
        after that, the referee's clock read around the go, then every output slot checked and some compared.
        The first ``warm`` calls are ordinary calls whose times are not samples (they share a few slots, so only
        calls after them are picked)."""
        plan = [{"inputs": sets[i % len(sets)], "outputs": slots[i], "swaps": self.canaries(sets[i % len(sets)])} for i in range(len(slots))]
        self.ask("arm", model=model, calls=plan, mode=mode, spin_us=spin_us, kernelbench=kernelbench)
        seeds = [self.rng.randrange(2**31) for _ in sets]
        for encoded, seed in zip(sets, seeds):
            for sent, value in zip(encoded["list"], self.inputs(shape, seed)):
                if "slot" in sent:
                    self.arena.view(sent["slot"]).copy_(value)
        for call_slots in slots:
            self.poison_slots(call_slots)
        wall_ms, reply = self.timed_go()
        ms = reply.get("ms")
        if not isinstance(ms, list) or len(ms) != len(plan) or not all(isinstance(m, (int, float)) and m > 0 for m in ms):
            raise GradeFailure(Outcome.RUNTIME_ERROR, "timing: the candidate's process returned no valid call times")
        self.count_work(shape, len(plan))
        if check:
            self.check_batch(ref_model, shape, sets, seeds, plan, warm)
        enqueue = [float(u) for u in reply.get("enqueue_us") or [] if isinstance(u, (int, float))]
        return {"ms": [float(m) for m in ms], "wall_ms": wall_ms, "enqueue_us": enqueue}

    def timed_go(self):
        """The armed batch run there, timed here: (wall ms of the command, reply)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        reply = self.ask("batch")
        return (time.perf_counter() - t0) * 1e3, reply

    def canaries(self, encoded: Dict[str, Any]) -> List[List[Any]]:
        """Per float input: SWAPS (dst, src) pairs of flat indices within one random row."""
        swaps = []
        for index, sent in enumerate(encoded["list"]):
            slot = sent.get("slot")
            if slot is None or slot["dtype"] not in ("float16", "bfloat16", "float32", "float64") or not slot["shape"]:
                continue
            row = slot["shape"][-1]
            rows = math.prod(slot["shape"]) // max(row, 1)
            if row < 2 * SWAPS or rows < 1:
                continue
            base = self.rng.randrange(rows) * row
            picked = self.rng.sample(range(row), 2 * SWAPS)
            swaps.append([index, [base + c for c in picked[:SWAPS]], [base + c for c in picked[SWAPS:]]])
        return swaps

    def check_batch(self, ref_model, shape, sets, seeds, plan, warm: int = 0) -> None:
        """Every slot written (no NaN left from the poison in float outputs); PICKS calls after the ``warm`` ones,
        chosen now, compared."""
        for i, call in enumerate(plan):
            for slot in call["outputs"]:
                view = self.arena.view(slot)
                if view.is_floating_point() and view.numel() and not torch.isfinite(view.float()).all():
                    raise GradeFailure(Outcome.INCORRECT, f"timed call {i} of a batch, shape {shape}: output left unwritten or not finite")
        for pick in sorted(self.rng.sample(range(warm, len(plan)), min(PICKS, len(plan) - warm))):
            j = pick % len(sets)
            inputs = self.inputs(shape, seeds[j])
            for i in range(j, pick + 1, len(sets)):
                apply_swaps(inputs, plan[i]["swaps"])
            expected = ref_model(*clone(inputs))
            try:
                checks.compare(expected, self.read(plan[pick]["outputs"], expected), self.spec["tolerance"])
            except checks.CheckFailure as exc:
                raise GradeFailure(Outcome.INCORRECT, f"timed call {pick} of a batch, shape {shape}: {exc}")

    def overheads(self, model: int, template: List[Any], sets, expected: Any, mode: str, spin_us: float, calls: int) -> Dict[str, float]:
        """What a batch's wall time holds besides the calls, measured here: the go's round trip (an empty batch
        there), and the same batch run in this process with a call that does nothing (spin, canaries, flushes,
        output copies, syncs); plus a slack."""
        self.ask("arm", model=model, calls=[], mode=mode, spin_us=0)
        parts = {"round_trip_ms": statistics.median(self.timed_go()[0] for _ in range(3))}
        local = clone(template)
        outputs = [torch.empty_like(t) for t in checks.as_tuple(expected)]
        flush = timing.L2Flush(self.req.l2_bytes) if mode != "host" else None
        align = timing.call_barrier(self.barrier, mode)  # as the runner's batch
        steps = [(lambda swaps=prepared_swaps(self.canaries(sets[i % len(sets)]), self.device): (apply_swaps(local, swaps), align()),
                  lambda: expected,
                  lambda out: [o.copy_(t) for o, t in zip(outputs, checks.as_tuple(out))]) for i in range(calls)]
        walls = []
        for _ in range(3):
            with profiled(self.device):  # as the runner's timed batches are
                t0 = time.perf_counter()
                timing.run_batch(steps, mode, spin_us, flush)
                walls.append((time.perf_counter() - t0) * 1e3)
        parts["null_batch_ms"] = statistics.median(walls)
        parts["slack_ms"] = (0.1 * parts["null_batch_ms"] + 1.0 + 0.1 * calls) if mode == "host" else (0.05 * parts["null_batch_ms"] + 0.3 + 0.02 * calls)
        parts["total_ms"] = parts["round_trip_ms"] + parts["null_batch_ms"] + parts["slack_ms"]
        return parts

    # -- baselines (here, before the candidate exists) ---------------------------------
    def time_baselines(self, shape: Dict[str, Any], deadline: float) -> Dict[str, Any]:
        ref_model = self.build(shape, 42)
        first = self.inputs(shape, 2026)
        sets = [first] + [self.inputs(shape, 2026 + i) for i in range(1, self.set_count(first))]
        return time_baselines(self.req, ref_model, sets, lambda: self.any_rank(time.perf_counter() > deadline), self.time_with_timers)

    def time_with_timers(self, fn: Callable, sets: List[List[Any]]) -> Dict[str, Any]:
        """kbsweep's figure (:meth:`time_here`, the scored one) and beside it, under ``timers``, each other timer the
        request names (``kernelbench``: :func:`~kbsweep.grader.timing.time_kernelbench` on the first input set)."""
        timed = self.time_here(fn, sets)
        others = {name: getattr(timing, f"time_{name}")(fn, sets[0], self.device) for name in self.req.timers}
        return {**timed, "timers": others} if others else timed

    def time_here(self, fn: Callable, sets: List[List[Any]]) -> Dict[str, Any]:
        """A trusted callable timed in this process by the same batches the candidate's runner uses."""
        mode = self.timing_mode()
        flush = timing.L2Flush(self.req.l2_bytes) if mode != "host" else None
        align = timing.call_barrier(self.barrier, mode)
        steps = lambda n: [(align, lambda i=i: fn(*sets[i % len(sets)]), lambda out: None) for i in range(n)]  # noqa: E731
        shape_ = self.agreed_batch(timing.calibrate_batch(lambda spin_us: timing.run_batch(steps(3), mode, spin_us, flush), mode != "back_to_back",
                                                          mode == "host"))
        samples: List[float] = []
        warm = int(shape_.get("warm_calls", 0))  # as the candidate's batches open
        began, elapsed = time.perf_counter(), 0.0
        # under the profiler the runner keeps on over the candidate's calls: CUPTI's cost per kernel (1.4% of a
        # 4096³ GEMM in a graph on the H200) is then in both sides of a speedup
        with profiled(self.device), timing.ClockSampler(self.device) as clocks:
            while not timing.stop(samples, self.cfg, elapsed):
                ms, elapsed = self.slowest(timing.run_batch(steps(warm + int(shape_["per_batch"])), mode, shape_["spin_us"], flush)["ms"],
                                           time.perf_counter() - began)
                samples += ms[warm:]
        return {**timing.summarize(samples, samples), "mode": mode, "per_batch": int(shape_["per_batch"]), "warm_calls": warm,
                "clocks": clocks.summary()}


def time_baselines(request: RefereeRequest, ref_model: Any, sets: List[List[Any]], spent: Callable[[], bool], timer: Callable) -> Dict[str, Any]:
    """Eager, torch.compile, SOTA... of ``request`` timed by ``timer(fn, sets)``; one that would start once
    ``spent()`` says the grade's baseline budget is gone (a slow compile must not cost the candidate its grade) is
    left for a later grade. Each but eager is first compared with the reference: one outside the tolerance is timed all the
    same (a library's own precision) and carries ``outside_tolerance``."""
    spec, out = request.spec, {}
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
            differs = None
            if name != "eager":  # eager is the reference itself
                expected = ref_model(*clone(sets[0])) if expected is None else expected
                try:
                    checks.compare(expected, fn(*clone(sets[0])), spec["tolerance"])
                except checks.CheckFailure as exc:
                    differs = str(exc)
            out[name] = timer(fn, sets)
            if differs:
                out[name]["outside_tolerance"] = differs
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


@contextlib.contextmanager
def profiled(device: torch.device):
    """The profiler session the runner keeps on over timed batches, here too on GPUs (its host overhead is part of
    a batch, its per-kernel cost part of every timed call)."""
    if device.type != "cuda":
        yield
        return
    with timing.profiler_session(device):
        yield

