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

from kbsweep.grader import checks, profiling, reference_timers, timing
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
        # a replay batch: the warm calls by events, then the timed calls as one graph; its bare twin (canaries,
        # flushes, output copies, no call) is this process's own, so what the calls added is not the runner's word
        bare = self.bare_replay(template, sets, expected, per_batch) if self.replays(mode, kernelbench) else None
        replay_overhead = self.overheads(model, template, sets, expected, mode, shape_["replay_spin_us"], warm) if bare else None
        ratios: List[float] = []
        shares: List[float] = []  # of the batch's wall time, what the calls claim: how much of it the ratio can see
        refused, captured = None, False

        def alternation() -> tuple:
            """Batches by the stop rule, events, replay, events...: (events' summary, replays' summary or None)."""
            nonlocal bare, refused, captured
            samples: List[float] = []
            replayed: List[float] = []
            began, elapsed = time.perf_counter(), 0.0
            while not timing.stop(samples, self.cfg, elapsed) or (bare and timing.replays_short(replayed, self.cfg)):
                as_replay = bare is not None and len(ratios) % 2 == 1
                batch = self.batch(ref_model, model, shape, sets, slots, mode, shape_["replay_spin_us" if as_replay else "spin_us"],
                                   check=not kernelbench, warm=warm, kernelbench=kernelbench, replay_from=warm if as_replay else None)
                if batch.get("replay_error"):
                    bare, refused = None, batch["replay_error"]
                    continue
                ms, elapsed = self.slowest(batch["ms"], time.perf_counter() - began)
                claimed = sum(ms)
                if as_replay:
                    if not captured:  # the runner captured the calls for this first replay: invoked, no kernel ran
                        tag, self.tag, captured = self.tag, self.tag + profiling.CAPTURE_TAG, True
                        self.count_work(shape, per_batch)
                        self.tag = tag
                    claimed += batch["replay_ms"]
                    replayed.append(timing.replay_sample(batch["replay_ms"], timing.run_batch([], mode, replay=bare)["replay_ms"], per_batch))
                else:
                    samples += ms[warm:]
                # this process's clock against the figures; across ranks each call lasts as long as its slowest rank
                # on every rank (they wait for each other), and one rank's low figures cannot lower that maximum
                ratios.append((batch["wall_ms"] - (replay_overhead if as_replay else overhead)["total_ms"]) / max(claimed, 1e-9))
                shares.append(claimed / max(batch["wall_ms"], 1e-9))
            return timing.summarize(samples, samples), timing.summarize(replayed, replayed) if replayed else ({"error": refused} if refused else None)

        with timing.ClockSampler(self.device) as clocks:
            looks = timing.looks(alternation)
        events, replay = looks[-1]
        timed = {**(timing.scored(events, replay) if mode == "back_to_back" else events), "mode": mode, "per_batch": per_batch,
                 "warm_calls": warm, "batches": len(ratios), "spin_us": shape_["spin_us"], "input_sets": len(sets), "clocks": clocks.summary()}
        ratio = statistics.median(ratios)
        timed["corroboration"] = {**overhead, "wall_over_claimed": ratio, "max_ratio": max(ratios), "band": BAND[mode],
                                  "claimed_share_of_wall": statistics.median(shares)}
        if ratio > BAND[mode]:
            self.findings.append({"kind": "time_disagreement", "shape": shape,
                                  "detail": f"{shape}: the referee's clock saw {ratio:.2f}x the time the candidate's process reported"})
        if len(looks) > 1:  # the first pass's figures, read under the band
            timed["first_look"] = {"events_ms": looks[0][0]["median_ms"], "replay_ms": looks[0][1]["median_ms"]}
        if timed.get("replay_refused") and replay and "median_ms" in replay:
            self.findings.append({"kind": "replay_outside_band", "shape": shape, "detail": f"{shape}: {timed['replay_refused']}"})
        entry: Dict[str, Any] = {"shape": shape, "input_sets": len(sets), "candidate": timed, "baselines": {}}
        # no graph figure across ranks: a rank whose capture fails would strand its peers in a captured collective
        if mode != "host" and (mode == "isolated" or timed["median_ms"] < 0.05) and timed.get("timer") != "replay" \
                and self.req.world_size == 1 and not kernelbench:
            graph = self.ask("graph", model=model, inputs=sets[0]).get("graph_ms")
            timed["graph_ms"] = float(graph) if isinstance(graph, (int, float)) else None
        return entry

    def replays(self, mode: str, kernelbench: bool = False) -> bool:
        """Whether back-to-back batches alternate with graph replays here (not for a KernelBench timing: its metrics
        time eagerly)."""
        return mode == "back_to_back" and self.cfg.replay and not kernelbench

    def bare_replay(self, template: List[Any], sets, expected: Any, calls: int) -> timing.Replay:
        """A replay batch's calls without the calls: canaries, flushes and output copies, captured here."""
        return timing.Replay(self.null_steps(template, sets, expected, calls, lambda: None), timing.L2Flush(self.req.l2_bytes))

    def null_steps(self, template: List[Any], sets, expected: Any, calls: int, align: Callable[[], Any]) -> List[tuple]:
        """A batch's steps with a call that does nothing: canaries on a copy of the inputs, ``align``, the output
        copied into slots of this process's own."""
        local = clone(template)
        outputs = [torch.empty_like(t) for t in checks.as_tuple(expected)]
        return [(lambda swaps=prepared_swaps(self.canaries(sets[i % len(sets)]), self.device): (apply_swaps(local, swaps), align()),
                 lambda: expected,
                 lambda out: [o.copy_(t) for o, t in zip(outputs, checks.as_tuple(out))]) for i in range(calls)]

    def batch(self, ref_model, model: int, shape, sets, slots, mode: str, spin_us: float, check: bool = True, warm: int = 0,
              kernelbench: bool = False, replay_from: Optional[int] = None) -> Dict[str, Any]:
        """One timed batch there: the plan (slots, canaries) sent when the runner is armed, fresh inputs written
        after that, the referee's clock read around the go, then every output slot checked and some compared.
        The first ``warm`` calls are ordinary calls whose times are not samples (they share a few slots, so only
        calls after them are picked). ``replay_from``: the calls from there on run as one graph replay
        (``replay_ms``); a capture the runner could not make comes back as ``replay_error``, nothing run."""
        plan = [{"inputs": sets[i % len(sets)], "outputs": slots[i], "swaps": self.canaries(sets[i % len(sets)])} for i in range(len(slots))]
        armed = self.ask("arm", model=model, calls=plan, mode=mode, spin_us=spin_us, kernelbench=kernelbench, replay_from=replay_from)
        if replay_from is not None and armed.get("replay_error"):
            return {"replay_error": str(armed["replay_error"])[:300]}
        seeds = [self.rng.randrange(2**31) for _ in sets]
        for encoded, seed in zip(sets, seeds):
            for sent, value in zip(encoded["list"], self.inputs(shape, seed)):
                if "slot" in sent:
                    self.arena.view(sent["slot"]).copy_(value)
        for call_slots in slots:
            self.poison_slots(call_slots)
        wall_ms, reply = self.timed_go()
        ms = reply.get("ms")
        timed_calls = len(plan) if replay_from is None else replay_from  # by events (the rest replayed)
        replay_ms = reply.get("replay_ms") if replay_from is not None else 1.0
        if not isinstance(ms, list) or len(ms) != timed_calls or not all(isinstance(m, (int, float)) and m > 0 for m in [*ms, replay_ms]):
            raise GradeFailure(Outcome.RUNTIME_ERROR, "timing: the candidate's process returned no valid call times")
        self.count_work(shape, timed_calls)
        if check:
            self.check_batch(ref_model, shape, sets, seeds, plan, warm)
        enqueue = [float(u) for u in reply.get("enqueue_us") or [] if isinstance(u, (int, float))]
        timed = {"ms": [float(m) for m in ms], "wall_ms": wall_ms, "enqueue_us": enqueue}
        return {**timed, "replay_ms": float(replay_ms)} if replay_from is not None else timed

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
        flush = timing.L2Flush(self.req.l2_bytes) if mode != "host" else None
        steps = self.null_steps(template, sets, expected, calls, timing.call_barrier(self.barrier, mode))  # as the runner's batch
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
        request names (``kernelbench``: :func:`~kbsweep.grader.reference_timers.time_kernelbench` on the first input set)."""
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
        shape_ = self.agreed_batch(timing.calibrate_batch(lambda spin_us: timing.run_batch(steps(3), mode, spin_us, flush), mode != "back_to_back",
                                                          mode == "host"))
        warm, per_batch = int(shape_.get("warm_calls", 0)), int(shape_["per_batch"])  # as the candidate's batches open
        replays, refused = None, None
        if self.replays(mode):
            try:
                replays = (timing.Replay(steps(per_batch), flush), timing.Replay(steps(per_batch, lambda *a: None), flush))
            except Exception as exc:  # noqa: BLE001 - a baseline a graph cannot hold is timed by events alone
                refused = f"capture failed: {one_line(exc)}"
        def alternation(session) -> tuple:
            """Batches by the stop rule, events, replay, events...: (events' summary, replays' summary or None)."""
            samples: List[float] = []
            replayed: List[float] = []
            began, elapsed = time.perf_counter(), 0.0
            while not timing.stop(samples, self.cfg, elapsed) or (replays and timing.replays_short(replayed, self.cfg)):
                if replays and len(samples) > len(replayed) * per_batch:
                    unrecorded = lambda: profiling.kernels_unrecorded(session)  # noqa: E731
                    full = timing.run_batch(steps(warm), mode, shape_["replay_spin_us"], flush, replays[0], unrecorded)["replay_ms"]
                    bare = timing.run_batch([], mode, replay=replays[1], unrecorded=unrecorded)["replay_ms"]
                    replayed.append(timing.replay_sample(full, bare, per_batch))
                    elapsed = time.perf_counter() - began
                    continue
                ms, elapsed = self.slowest(timing.run_batch(steps(warm + per_batch), mode, shape_["spin_us"], flush)["ms"], time.perf_counter() - began)
                samples += ms[warm:]
            return timing.summarize(samples, samples), timing.summarize(replayed, replayed) if replayed else ({"error": refused} if refused else None)

        # under the profiler the runner keeps on over the candidate's calls: CUPTI's cost per kernel (1.4% of a
        # 4096³ GEMM in a graph on the H200) is then in both sides of a speedup; replays run without it there and here
        with profiled(self.device) as session, timing.ClockSampler(self.device) as clocks:
            events, replay = timing.looks(lambda: alternation(session))[-1]  # by the candidate's rule
        return {**(timing.scored(events, replay) if mode == "back_to_back" else events), "mode": mode, "per_batch": per_batch,
                "warm_calls": warm, "clocks": clocks.summary()}


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
    a batch, its per-kernel cost part of every event-timed call); yields the session (None off GPUs)."""
    if device.type != "cuda":
        yield None
        return
    with profiling.profiler_session(device) as session:
        yield session
