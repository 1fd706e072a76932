"""The timing stage: the candidate timed by the referee's own clock around batches run in its runner, every
output checked, and the baselines timed here by the same batches before the candidate exists. The timer itself
(batches, flushes, the stopping rule) is :mod:`kbsweep.grader.shared.timing`, for every rank alike.

A batch's scored figure is this process's: its clock around the go (the fresh inputs copied into the arena inside
it, so no call can start before it), less a null it measured without the candidate (an empty batch's go in the
runner before the candidate was imported, its instruments on, and the same batch run here with a call that does nothing: copies, flushes,
syncs; each a minimum, so the null errs against the candidate), over the batch's calls. The runner's per-call
figures are evidence: set against the referee's, they show a patched timer."""
from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from kbsweep.grader.referee import checks, corroboration, reference_timers, runner_cpu
from kbsweep.grader.referee.host_load import HostBusy, QuietHost
from kbsweep.grader.shared import profiling, timing
from kbsweep.grader.shared.arena import clone, encode
from kbsweep.grader.referee.candidate import CandidateContext
from kbsweep.grader.shared.modules import load_module
from kbsweep.grader.shared.failures import GradeFailure, one_line
from kbsweep.grader.referee.request import RefereeRequest
from kbsweep.outcomes import Outcome

PICKS = 2  # calls of each timed batch whose outputs are compared with the reference after it
SAMPLES = 4  # elements of every timed output read as the runner answers, and again after the checks
NULLS = 3  # null batches measured per shape and kind; the fastest is subtracted


class TimingStage(CandidateContext):
    """The candidate's batches there and the baselines' here, on one timer, scored by this process's clock."""

    round_trip_ms = 0.0  # an empty batch's, before the candidate was imported (:meth:`trusted_round_trip`)
    runner_cpu: Optional[runner_cpu.RunnerCPU] = None  # the runner's threads from the host's /proc (single-process grades)
    null_copies_ms = 0.0  # the fastest copy of a batch's fresh inputs in the last null measured (:meth:`null_ms`)

    def trusted_round_trip(self) -> None:
        """A timed batch's go with no calls, in this grade's timing mode, while the runner holds harness code only
        (its instruments on, as over every later command): the fastest of a few, the part of every batch's wall
        that is the channel's and the runner's own handling. The runner's calling thread is pinned meanwhile."""
        if self.runner_cpu is not None:
            self.runner_cpu.pin()
        self.ask("instrument")
        walls = []
        for _ in range(5):
            self.ask("arm", calls=[], mode=self.timing_mode())
            t0 = time.perf_counter()
            self.ask("batch")
            walls.append((time.perf_counter() - t0) * 1e3)
        self.round_trip_ms = min(walls)

    def timing_mode(self) -> str:
        if self.device.type != "cuda":
            return "host"
        return "isolated" if self.spec.get("regime") == "latency" else "back_to_back"

    def kernelbench_timing(self, baselines: List[Dict[str, Any]]) -> Dict[str, Any]:
        """A candidate KernelBench's eval calls correct and kbsweep's checks failed, timed for KernelBench's metrics
        only: by the referee's clock, its outputs taken as KernelBench takes them and not compared (KernelBench
        checks nothing while it times). kbsweep's verdict stays failed."""
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
        """The candidate timed by this process's clock, batch by batch; every timed call on an input set of its own,
        drawn afresh per batch; after each batch every output slot must be written and the outputs of calls picked
        now must match the reference (``kernelbench``: outputs as KernelBench takes them, nothing compared)."""
        self.shape = shape
        self.open_arena(self.arena_size(shape))
        ref_model = self.build(shape, 42)
        model = self.send_model(ref_model, shape, 42)
        template = self.inputs(shape, 2026)
        expected = self.first_output(shape)
        mode = self.timing_mode()
        warm_slots = [self.output_slots(expected) for _ in range(3)]
        sets = [encode(template, self.arena) for _ in range(self.set_count(template))]
        shape_ = self.agreed_batch(timing.calibrate_batch(lambda spin_us: self.calibration(model, sets, warm_slots, mode, spin_us, kernelbench),
                                                          mode != "back_to_back", mode == "host"))
        per_batch, warm = min(int(shape_["per_batch"]), self.calls_cap(template, expected)), int(shape_.get("warm_calls", 0))
        sets += [encode(template, self.arena) for _ in range(per_batch - len(sets))]  # no timed call shares its inputs
        slots = [warm_slots[i % len(warm_slots)] for i in range(warm)] + [self.output_slots(expected) for _ in range(per_batch)]
        bare = self.bare_replay(expected, per_batch) if self.replays(mode, kernelbench) else None
        null, null_loop = {}, {}  # per kind: the whole null, and its batch alone (what the runner's own loop clock spans)
        for kind, replay in (("events", None), ("replay", bare)):
            if kind == "events" or bare:
                null[kind], null_loop[kind] = self.null_ms(template, self.input_targets(sets, per_batch), expected, mode, replay)
        figures: Dict[str, List[float]] = {"events": [], "replay": []}
        ratios: List[tuple] = []  # per batch: the referee's figure, the runner's, the referee's slack (per call), its kind
        refused, captured = None, False
        began, elapsed = time.perf_counter(), 0.0
        with timing.ClockSampler(self.device) as clocks:
            while not timing.stop(figures["replay" if bare else "events"], self.cfg, elapsed, per_batch) \
                    or (bare and timing.replays_short(figures["replay"], self.cfg)):
                kind = "replay" if bare is not None and len(ratios) % 2 == 1 else "events"
                batch = self.batch(ref_model, model, shape, sets, slots, mode, warm, check=not kernelbench, kernelbench=kernelbench, replay=kind == "replay")
                if batch.get("replay_error"):
                    bare, refused = None, batch["replay_error"]
                    continue
                if kind == "replay" and not captured:  # the runner captured the calls for this first replay: invoked, no kernel ran
                    tag, self.tag, captured = self.tag, self.tag + profiling.CAPTURE_TAG, True
                    self.count_work(shape, per_batch)
                    self.tag = tag
                sample = timing.referee_sample(batch["wall_ms"], null[kind], per_batch)
                (sample,), elapsed = self.slowest([sample], time.perf_counter() - began, batch["ms"])
                if mode == "back_to_back" and not warm and timing.warm_calls_for(sample * 1e3):
                    # the runner's own figures shaped the batch; this clock's says its calls need warm calls: batches
                    # from here on open with them (a runner reporting less than its calls take keeps no boost clock)
                    warm = timing.warm_calls_for(sample * 1e3)
                    slots = [warm_slots[i % len(warm_slots)] for i in range(warm)] + slots
                    figures, ratios = {"events": [], "replay": []}, []
                    continue
                figures[kind].append(sample)
                # the loop's wall where the GPU may wait on the host; on CPU each call's own clock covers all of it
                claimed = timing.events_claim(batch["ms"], batch["loop_ms"] if mode != "host" else None, null_loop[kind], per_batch) if kind == "events" else \
                    timing.replay_sample(batch["replay_ms"], timing.run_batch([], mode, replay=bare)["replay_ms"], per_batch)
                ratios.append((sample, claimed, corroboration.slack_ms(mode, null[kind], per_batch) / per_batch, kind,
                               (batch["copy_ms"], batch["wall_ms"], batch["loop_ms"], batch["others_cpu_ms"])))
        events = timing.summarize(figures["events"]) if figures["events"] else None
        replay = timing.summarize(figures["replay"]) if figures["replay"] else ({"error": refused} if refused else None)
        timed = {**(timing.scored(events, replay) if mode == "back_to_back" else events), "clock": "referee", "mode": mode, "per_batch": per_batch,
                 "warm_calls": warm, "batches": len(ratios), "input_sets": len(sets), "clocks": clocks.summary()}
        timed["calls"] = timed["runs"] * per_batch  # each run (sample) is one batch's figure
        record, finding = corroboration.corroborate(shape, ratios)
        self.findings += [finding] if finding else []
        timed["corroboration"] = {**record, "round_trip_ms": self.round_trip_ms, "null_ms": null, "null_loop_ms": null_loop,
                                  "null_copies_ms": self.null_copies_ms}
        return {"shape": shape, "input_sets": len(sets), "candidate": timed, "baselines": {}}

    def replays(self, mode: str, kernelbench: bool = False) -> bool:
        """Whether back-to-back batches alternate with graph replays (never for KernelBench's metrics: eager)."""
        return mode == "back_to_back" and self.cfg.replay and not kernelbench

    def bare_replay(self, expected: Any, calls: int) -> timing.Replay:
        """A replay batch's calls without the calls: flushes and output copies, captured here."""
        return timing.Replay(self.null_steps(expected, calls, lambda: None), timing.L2Flush(self.req.l2_bytes))

    def null_steps(self, expected: Any, calls: int, align: Callable[[], Any]) -> List[tuple]:
        """A batch's steps with a call that does nothing: ``align``, the output copied into slots of this process's own."""
        outputs = [torch.empty_like(t) for t in checks.as_tuple(expected)]
        return [(align, lambda: expected, lambda out: [o.copy_(t) for o, t in zip(outputs, checks.as_tuple(out))]) for _ in range(calls)]

    def input_targets(self, sets: List[Dict[str, Any]], calls: int) -> List[List[Any]]:
        """The arena views the first ``calls`` input sets' tensors live in (None for values sent inline)."""
        return [[self.arena.view(sent["slot"]) if "slot" in sent else None for sent in sets[i]["list"]] for i in range(calls)]

    def null_ms(self, template: List[Any], targets: List[List[Any]], expected: Any, mode: str, replay: Optional[timing.Replay] = None) -> tuple:
        """Everything a batch's wall time holds besides the calls, measured here without the candidate: the fresh
        inputs' copies (into the very ``targets`` a batch copies into, the arena's shared pages), the trusted
        empty batch's go (:meth:`trusted_round_trip`), and the batch (or ``replay``) with calls that do nothing; the fastest of NULLS, so it
        errs against the candidate. Returns (that, the batch's part alone)."""
        calls = len(targets)
        staged = [clone(template) for _ in range(calls)]
        flush = timing.L2Flush(self.req.l2_bytes) if mode != "host" else None
        steps = [] if replay else self.null_steps(expected, calls, timing.call_barrier(self.barrier, mode))
        walls, loops, copies = [], [], []
        for _ in range(NULLS):
            # under the profiler as the runner's batches run: a replay's with its kernel records paused, as there
            with profiled(self.device) as session, profiling.kernels_unrecorded(session) if replay and session else contextlib.nullcontext():
                self.sync()
                t0 = time.perf_counter()
                self.copy_sets(targets, staged)
                self.sync()
                copies.append((time.perf_counter() - t0) * 1e3)
                loops.append(timing.run_batch(steps, mode, 0.0, flush, replay)["loop_ms"])
                walls.append((time.perf_counter() - t0) * 1e3)
        self.null_copies_ms = min(copies)  # evidence beside each batch's own copies (the corroboration's record)
        return min(walls) + self.round_trip_ms, min(loops)

    def sync(self) -> None:
        torch.cuda.synchronize() if self.device.type == "cuda" else None

    @staticmethod
    def copy_sets(targets: List[List[Any]], staged: List[List[Any]]) -> None:
        """Every call's fresh inputs into their slots, as few launches as torch groups them into: a launch per
        tensor put a batch of 42 small sets' host jitter (0.7-1.3 ms on an H100) into the wall its null subtracts."""
        pairs = [(t, v) for target, fresh in zip(targets, staged) for t, v in zip(target, fresh) if isinstance(t, torch.Tensor)]
        if pairs:
            torch._foreach_copy_([t for t, _ in pairs], [v for _, v in pairs])

    def calibration(self, model: int, sets, slots, mode: str, spin_us: float, kernelbench: bool) -> Dict[str, Any]:
        """A warm-up batch there (its figures shape the batches, never a score): ``run_batch``'s per-call times."""
        plan = [{"inputs": sets[i % len(sets)], "outputs": slot} for i, slot in enumerate(slots)]
        self.ask("arm", model=model, calls=plan, mode=mode, spin_us=spin_us, kernelbench=kernelbench)
        return self.ask("batch")

    def batch(self, ref_model, model: int, shape, sets, slots, mode: str, warm: int, check: bool = True,
              kernelbench: bool = False, replay: bool = False) -> Dict[str, Any]:
        """One timed batch there: the plan sent when the runner is armed, its warm calls run, then this process's
        clock around the fresh inputs' copies into the arena and the go. Every output slot is then read at a few
        secret elements at once, checked written, some compared, and read again: an element that changed was
        written after the runner answered. ``replay``: the timed calls run as one graph replay (``replay_ms``);
        a capture the runner could not make comes back as ``replay_error``, nothing run."""
        timed = slots[warm:]
        plan = [{"inputs": sets[i % len(sets)], "outputs": s} for i, s in enumerate(slots[:warm])] + \
               [{"inputs": sets[i], "outputs": s} for i, s in enumerate(timed)]
        armed = self.ask("arm", model=model, calls=plan, warm=warm, mode=mode, replay=replay, kernelbench=kernelbench)
        if replay and armed.get("replay_error"):
            return {"replay_error": str(armed["replay_error"])[:300]}
        staged = [self.inputs(shape, self.rng.randrange(2**31)) for _ in timed]  # this process's until the clock runs
        targets = self.input_targets(sets, len(timed))
        for call_slots in timed:
            self.poison_slots(call_slots)
        picks = self.secret_elements(timed)
        if warm:
            self.ask("warm")
        before = self.runner_cpu.read() if self.runner_cpu else None
        wall_ms, copy_ms, reply = self.timed_go(targets, staged)
        cpu = self.runner_cpu.others_ms(before, self.runner_cpu.read()) if self.runner_cpu else None
        answered = self.read_elements(picks)
        ms = reply.get("ms")
        replay_ms = reply.get("replay_ms") if replay else 1.0
        if not isinstance(ms, list) or len(ms) != (0 if replay else len(timed)) or not all(isinstance(m, (int, float)) and m > 0 for m in [*ms, replay_ms]):
            raise GradeFailure(Outcome.RUNTIME_ERROR, "timing: the candidate's process returned no valid call times")
        self.count_work(shape, warm + (0 if replay else len(timed)))
        if check:
            self.check_batch(ref_model, shape, staged, timed)
        if not torch.equal(answered, self.read_elements(picks)):
            self.findings.append({"kind": "forged_result", "shape": shape, "detail": f"{shape}: a timed output was written after the candidate's process answered"})
            raise GradeFailure(Outcome.INCORRECT, f"shape {shape}: a timed call's output was still being written after its batch was reported done")
        loop_ms = reply.get("loop_ms")
        figures = {"ms": [float(m) for m in ms], "loop_ms": float(loop_ms) if isinstance(loop_ms, (int, float)) else None, "wall_ms": wall_ms,
                   "copy_ms": copy_ms, "others_cpu_ms": cpu and cpu["others_ms"]}
        found = cpu and runner_cpu.finding("a timed batch", shape, cpu, wall_ms, mode)
        if found and not any(f["kind"] == found["kind"] for f in self.findings):
            self.findings.append(found)
        return {**figures, "replay_ms": float(replay_ms)} if replay else figures

    def timed_go(self, targets: List[List[Any]], staged: List[List[Any]]) -> tuple:
        """(wall ms, the copies' ms, reply) of the go, on this process's clock: the fresh inputs copied into the arena
        (no call can start on them before the clock does), then the armed batch run there."""
        self.sync()
        t0 = time.perf_counter()
        self.copy_sets(targets, staged)
        self.sync()  # the copies are there before the go (the channel would sync them too); their time is evidence
        copied = time.perf_counter()
        reply = self.ask("batch")
        return (time.perf_counter() - t0) * 1e3, (copied - t0) * 1e3, reply

    def secret_elements(self, slots: List[List[Dict[str, Any]]]) -> List[tuple]:
        """SAMPLES flat elements of every output slot, drawn now: (flat view, indices on its device)."""
        picks = []
        for call_slots in slots:
            for slot in call_slots:
                flat = self.arena.view(slot).reshape(-1)
                if flat.numel():
                    at = [self.rng.randrange(flat.numel()) for _ in range(SAMPLES)]
                    picks.append((flat, torch.tensor(at, device=flat.device)))
        return picks

    @staticmethod
    def read_elements(picks: List[tuple]) -> torch.Tensor:
        """The picked elements' bytes, read at once (one copy to the host)."""
        taken = [flat[at].reshape(-1).view(torch.uint8) for flat, at in picks]
        return torch.cat(taken).cpu() if taken else torch.empty(0, dtype=torch.uint8)

    def check_batch(self, ref_model, shape, staged: List[List[Any]], slots: List[List[Dict[str, Any]]]) -> None:
        """Every timed slot written (no NaN left from the poison in float outputs); PICKS calls, chosen now, compared
        with the reference on the inputs they were given."""
        for i, call_slots in enumerate(slots):
            for slot in call_slots:
                view = self.arena.view(slot)
                if view.is_floating_point() and view.numel() and not torch.isfinite(view.float()).all():
                    raise GradeFailure(Outcome.INCORRECT, f"timed call {i} of a batch, shape {shape}: output left unwritten or not finite")
        for pick in sorted(self.rng.sample(range(len(slots)), min(PICKS, len(slots)))):
            expected = ref_model(*clone(staged[pick]))
            try:
                self.verify(staged[pick], expected, self.read(slots[pick], expected))
            except checks.CheckFailure as exc:
                raise GradeFailure(Outcome.INCORRECT, f"timed call {pick} of a batch, shape {shape}: {exc}")

    # -- baselines (here, before the candidate exists) ---------------------------------
    def time_baselines(self, shape: Dict[str, Any], deadline: float) -> Dict[str, Any]:
        ref_model = self.build(shape, 42)
        first = self.inputs(shape, 2026)
        sets = [first] + [self.inputs(shape, 2026 + i) for i in range(1, self.set_count(first))]
        return time_baselines(self.req, ref_model, sets, lambda: self.any_rank(time.perf_counter() > deadline), self.time_quietly)

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
            """Batches until timing.baseline_done ends them, events, replay, events...: (events' summary, replays' summary or None)."""
            samples: List[float] = []
            replayed: List[float] = []
            began, elapsed = time.perf_counter(), 0.0
            while not timing.baseline_done(samples, replayed, self.cfg, elapsed, replays is not None, per_batch):
                if replays and len(samples) > len(replayed) * per_batch:
                    unrecorded = lambda: profiling.kernels_unrecorded(session)  # noqa: E731
                    full = timing.run_batch(steps(warm), mode, shape_["replay_spin_us"], flush, replays[0], unrecorded)["replay_ms"]
                    bare = timing.run_batch([], mode, replay=replays[1], unrecorded=unrecorded)["replay_ms"]
                    replayed.append(timing.replay_sample(full, bare, per_batch))
                    elapsed = time.perf_counter() - began
                    continue
                ms, elapsed = self.slowest(timing.run_batch(steps(warm + per_batch), mode, shape_["spin_us"], flush)["ms"], time.perf_counter() - began)
                samples += ms[warm:]
            return timing.summarize(samples), timing.summarize(replayed) if replayed else ({"error": refused} if refused else None)

        # under the profiler the runner keeps on over the candidate's calls: CUPTI's cost per kernel (1.4% of a
        # 4096³ GEMM in a graph on the H200) is then in both sides of a speedup; replays run without it there and here
        with profiled(self.device) as session, timing.ClockSampler(self.device) as clocks:
            events, replay = alternation(session)
        return {**(timing.scored(events, replay) if mode == "back_to_back" else events), "mode": mode, "per_batch": per_batch,
                "warm_calls": warm, "clocks": clocks.summary()}


def time_baselines(request: RefereeRequest, ref_model: Any, sets: List[List[Any]], spent: Callable[[], bool], timer: Callable) -> Dict[str, Any]:
    """Eager, torch.compile, SOTA... of ``request`` timed by ``timer(name, fn, sets)``; one that would start once
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
            differs, began = None, time.perf_counter()
            if name != "eager":  # eager is the reference itself
                expected = ref_model(*clone(sets[0])) if expected is None else expected
                try:
                    checks.compare(expected, fn(*clone(sets[0])), spec["tolerance"])
                except checks.CheckFailure as exc:
                    differs = str(exc)
            checked = time.perf_counter()  # a compile baseline compiled in its check's first call
            out[name] = timer(name, fn, sets)
            out[name]["cost_s"] = {"check": round(checked - began, 3), "timing": round(time.perf_counter() - checked, 3)}
            if differs:
                out[name]["outside_tolerance"] = differs
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


@contextlib.contextmanager
def profiled(device: torch.device):
    """The profiler session the runner keeps on over timed batches, here too on GPUs (its host overhead is part of
    a batch, its per-kernel cost part of every event-timed call); yields the session (None off GPUs)."""
    if device.type != "cuda":
        yield None
        return
    with profiling.profiler_session(device) as session:
        yield session
