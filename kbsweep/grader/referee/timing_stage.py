"""The timing stage: the candidate timed by the referee's own clock around batches run in its runner, every
output checked, and the baselines timed here by the same batches before the candidate exists. The timer itself
(batches, flushes, the stopping rule) is :mod:`kbsweep.grader.shared.timing`, for every rank alike.

A batch's scored figure is this process's: its clock around the go (the fresh inputs copied into the arena inside
it, so no call can start before it), less a null it measured without the candidate (the go's way there and back,
timed in the runner before the candidate was imported, its instruments on, and the same batch run here with a call
that does nothing: copies, flushes, syncs; each a minimum, so the null errs against the candidate), over the batch's
calls. The runner's per-call
figures are evidence: set against the referee's, they show a patched timer."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Dict, List, Optional

import torch

from kbsweep.grader.referee import checks, corroboration, runner_cpu
from kbsweep.grader.referee.baseline_stage import BaselineStage
from kbsweep.grader.shared import profiling, timing
from kbsweep.grader.shared.arena import clone, encode
from kbsweep.grader.shared.failures import GradeFailure
from kbsweep.outcomes import Outcome

PICKS = 2  # calls of each timed batch whose outputs are compared with the reference after it
SAMPLES = 4  # elements of every timed output read as the runner answers, and again after the checks
NULLS = 3  # null batches measured per shape and kind; the fastest is subtracted
ROUND_TRIPS = 5  # trusted gos of each kind (:meth:`TimingStage.trusted_round_trip`)
ROUND_TRIP_IDLE_S = 0.003  # the runner idle before a go, as while a batch's inputs are drawn and copied
ROUND_TRIP_HOLD_US = 3000.0  # the GPU holding up the runner's loop, so the referee's thread sleeps as over a batch


class TimingStage(BaselineStage):
    """The candidate's batches there and the baselines' here, on one timer, scored by this process's clock."""

    round_trip_ms = 0.0  # an empty batch's, before the candidate was imported (:meth:`trusted_round_trip`)
    runner_cpu: Optional[runner_cpu.RunnerCPU] = (
        None  # the runner's threads from the host's /proc (single-process grades)
    )
    round_trip_split_ms: List[Optional[float]] = []  # its parts (:func:`split_ms`), evidence
    round_trip_empty_ms = 0.0  # the bare wall of a go with nothing before or in it, evidence
    null_copies_ms = 0.0  # the fastest copy of a batch's fresh inputs in the last null measured (:meth:`null_ms`)

    def trusted_round_trip(self) -> None:
        """The part of every batch's wall outside the runner's loop (the go's way there and back, the runner's own
        handling), measured while the runner holds harness code only (its instruments on, as over every later
        command), so its own figures are still true: the fastest of a few gos with no calls, each as a timed batch's
        comes, after the runner waited idle and over a loop the GPU holds up (the threads on both sides sleep as they
        do around a real batch, and wake as slowly), its loop taken off. The empty go's bare wall stays as evidence.
        The runner's calling thread is pinned meanwhile."""
        if self.runner_cpu is not None:
            self.runner_cpu.pin()
        self.ask("instrument")
        mode = self.timing_mode()
        empty: List[tuple] = []
        held: List[tuple] = []
        for spin_us in [0.0] * ROUND_TRIPS + [ROUND_TRIP_HOLD_US] * ROUND_TRIPS:
            self.ask("arm", calls=[], mode=mode, spin_us=spin_us)
            if spin_us:
                time.sleep(ROUND_TRIP_IDLE_S)
            t0 = time.perf_counter()
            reply = self.ask("batch")
            answered = time.perf_counter()
            loop_ms = reply.get("loop_ms") if spin_us else 0.0
            wall_ms = (answered - t0) * 1e3 - (loop_ms if isinstance(loop_ms, float) else 0.0)
            (held if spin_us else empty).append((wall_ms, split_ms(t0, reply.get("stamps"), answered)))
        self.round_trip_empty_ms = min(empty)[0]
        self.round_trip_ms, self.round_trip_split_ms = min(held, key=lambda wall: wall[0])

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
        shape_ = self.agreed_batch(
            timing.calibrate_batch(
                lambda spin_us: self.calibration(model, sets, warm_slots, mode, spin_us, kernelbench),
                mode != "back_to_back",
                mode == "host",
            )
        )
        per_batch, warm = (
            min(int(shape_["per_batch"]), self.calls_cap(template, expected)),
            int(shape_.get("warm_calls", 0)),
        )
        sets += [encode(template, self.arena) for _ in range(per_batch - len(sets))]  # no timed call shares its inputs
        slots = [warm_slots[i % len(warm_slots)] for i in range(warm)] + [
            self.output_slots(expected) for _ in range(per_batch)
        ]
        bare = self.bare_replay(expected, per_batch) if self.replays(mode, kernelbench) else None
        null, null_loop = (
            {},
            {},
        )  # per kind: the whole null, and its batch alone (what the runner's own loop clock spans)
        for kind, replay in (("events", None), ("replay", bare)):
            if kind == "events" or bare:
                null[kind], null_loop[kind] = self.null_ms(
                    template, self.input_targets(sets, per_batch), expected, mode, replay
                )
        figures: Dict[str, List[float]] = {"events": [], "replay": []}
        ratios: List[
            tuple
        ] = []  # per batch: the referee's figure, the runner's, the referee's slack (per call), its kind
        refused, captured = None, False
        began, elapsed = time.perf_counter(), 0.0
        with timing.ClockSampler(self.device) as clocks:
            while not timing.stop(figures["replay" if bare else "events"], self.cfg, elapsed, per_batch) or (
                bare and timing.replays_short(figures["replay"], self.cfg)
            ):
                kind = "replay" if bare is not None and len(ratios) % 2 == 1 else "events"
                batch = self.batch(
                    ref_model,
                    model,
                    shape,
                    sets,
                    slots,
                    mode,
                    warm,
                    check=not kernelbench,
                    kernelbench=kernelbench,
                    replay=kind == "replay",
                )
                if batch.get("replay_error"):
                    bare, refused = None, batch["replay_error"]
                    continue
                if (
                    kind == "replay" and not captured
                ):  # the runner captured the calls for this first replay: invoked, no kernel ran
                    tag, self.tag, captured = self.tag, self.tag + profiling.CAPTURE_TAG, True
                    self.count_work(shape, per_batch)
                    self.tag = tag
                sample = timing.referee_sample(batch["wall_ms"], self.batch_null(null[kind], batch), per_batch)
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
                claimed = (
                    timing.events_claim(
                        batch["ms"], batch["loop_ms"] if mode != "host" else None, null_loop[kind], per_batch
                    )
                    if kind == "events"
                    else timing.replay_sample(
                        batch["replay_ms"], timing.run_batch([], mode, replay=bare)["replay_ms"], per_batch
                    )
                )
                ratios.append(
                    (
                        sample,
                        claimed,
                        corroboration.slack_ms(mode, null[kind], per_batch) / per_batch,
                        kind,
                        (
                            batch["copy_ms"],
                            batch["wall_ms"],
                            batch["loop_ms"],
                            batch["others_cpu_ms"],
                            *batch["split_ms"],
                        ),
                    )
                )
        events = timing.summarize(figures["events"]) if figures["events"] else None
        replays = (
            timing.summarize(figures["replay"]) if figures["replay"] else ({"error": refused} if refused else None)
        )
        timed = {
            **(timing.scored(events, replays) if mode == "back_to_back" else events or {}),
            "clock": "referee",
            "mode": mode,
            "per_batch": per_batch,
            "warm_calls": warm,
            "batches": len(ratios),
            "input_sets": len(sets),
            "clocks": clocks.summary(),
        }
        timed["calls"] = timed["runs"] * per_batch  # each run (sample) is one batch's figure
        record, finding = corroboration.corroborate(shape, ratios)
        self.findings += [finding] if finding else []
        timed["corroboration"] = {
            **record,
            "round_trip_ms": self.round_trip_ms,
            "round_trip_split_ms": self.round_trip_split_ms,
            "round_trip_empty_ms": self.round_trip_empty_ms,
            "null_ms": null,
            "null_loop_ms": null_loop,
            "null_copies_ms": self.null_copies_ms,
        }
        return {"shape": shape, "input_sets": len(sets), "candidate": timed, "baselines": {}}

    def bare_replay(self, expected: Any, calls: int) -> timing.Replay:
        """A replay batch's calls without the calls: flushes and output copies, captured here."""
        return timing.Replay(self.null_steps(expected, calls, lambda: None), timing.L2Flush(self.req.l2_bytes))

    def null_steps(self, expected: Any, calls: int, align: Callable[[], Any]) -> List[tuple]:
        """A batch's steps with a call that does nothing: ``align``, the output copied into slots of this process's own."""
        outputs = [torch.empty_like(t) for t in checks.as_tuple(expected)]
        return [
            (align, lambda: expected, lambda out: [o.copy_(t) for o, t in zip(outputs, checks.as_tuple(out))])
            for _ in range(calls)
        ]

    def input_targets(self, sets: List[Dict[str, Any]], calls: int) -> List[List[Any]]:
        """The arena views the first ``calls`` input sets' tensors live in (None for values sent inline)."""
        return [
            [self.arena.view(sent["slot"]) if "slot" in sent else None for sent in sets[i]["list"]]
            for i in range(calls)
        ]

    def null_ms(
        self,
        template: List[Any],
        targets: List[List[Any]],
        expected: Any,
        mode: str,
        replay: Optional[timing.Replay] = None,
    ) -> tuple:
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
            with (
                profiling.profiled(self.device) as session,
                profiling.kernels_unrecorded(session) if replay and session else contextlib.nullcontext(),
            ):
                self.sync()
                t0 = time.perf_counter()
                self.copy_sets(targets, staged)
                self.sync()
                copies.append((time.perf_counter() - t0) * 1e3)
                loops.append(timing.run_batch(steps, mode, 0.0, flush, replay)["loop_ms"])
                walls.append((time.perf_counter() - t0) * 1e3)
        self.null_copies_ms = min(copies)  # evidence beside each batch's own copies (the corroboration's record)
        return min(walls) + self.round_trip_ms, min(loops)

    def batch_null(self, null: float, batch: Dict[str, Any]) -> float:
        """``null`` for this batch: its trusted round trip no longer than what this batch's own wall held outside
        the runner's loop (by that loop's own figure: a runner reporting a longer loop only takes less off), so the
        subtraction never exceeds what the batch spent there, and errs against the candidate either way."""
        loop, outside = batch.get("loop_ms"), self.round_trip_ms
        if isinstance(loop, float):
            outside = max(batch["wall_ms"] - batch["copy_ms"] - loop, 0.0)
        return null - self.round_trip_ms + min(self.round_trip_ms, outside)

    def sync(self) -> None:
        torch.cuda.synchronize() if self.device.type == "cuda" else None

    @staticmethod
    def copy_sets(targets: List[List[Any]], staged: List[List[Any]]) -> None:
        """Every call's fresh inputs into their slots, as few launches as torch groups them into: a launch per
        tensor put a batch of 42 small sets' host jitter (0.7-1.3 ms on an H100) into the wall its null subtracts."""
        pairs = [
            (t, v)
            for target, fresh in zip(targets, staged)
            for t, v in zip(target, fresh)
            if isinstance(t, torch.Tensor)
        ]
        if pairs:
            torch._foreach_copy_([t for t, _ in pairs], [v for _, v in pairs])

    def calibration(self, model: int, sets, slots, mode: str, spin_us: float, kernelbench: bool) -> Dict[str, Any]:
        """A warm-up batch there (its figures shape the batches, never a score): ``run_batch``'s per-call times."""
        plan = [{"inputs": sets[i % len(sets)], "outputs": slot} for i, slot in enumerate(slots)]
        self.ask("arm", model=model, calls=plan, mode=mode, spin_us=spin_us, kernelbench=kernelbench)
        return self.ask("batch")

    def batch(
        self,
        ref_model,
        model: int,
        shape,
        sets,
        slots,
        mode: str,
        warm: int,
        check: bool = True,
        kernelbench: bool = False,
        replay: bool = False,
    ) -> Dict[str, Any]:
        """One timed batch there: the plan sent when the runner is armed, its warm calls run, then this process's
        clock around the fresh inputs' copies into the arena and the go. Every output slot is then read at a few
        secret elements at once, checked written, some compared, and read again: an element that changed was
        written after the runner answered. ``replay``: the timed calls run as one graph replay (``replay_ms``);
        a capture the runner could not make comes back as ``replay_error``, nothing run."""
        timed = slots[warm:]
        plan = [{"inputs": sets[i % len(sets)], "outputs": s} for i, s in enumerate(slots[:warm])] + [
            {"inputs": sets[i], "outputs": s} for i, s in enumerate(timed)
        ]
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
        reader = self.runner_cpu
        before = reader.read() if reader else None
        wall_ms, copy_ms, reply = self.timed_go(targets, staged)
        cpu = reader.others_ms(before, reader.read()) if reader and before else None
        answered = self.read_elements(picks)
        ms = reply.get("ms")
        replay_ms = reply.get("replay_ms") if replay else 1.0
        if (
            not isinstance(ms, list)
            or len(ms) != (0 if replay else len(timed))
            or not all(isinstance(m, (int, float)) and m > 0 for m in [*ms, replay_ms])
        ):
            raise GradeFailure(Outcome.RUNTIME_ERROR, "timing: the candidate's process returned no valid call times")
        self.count_work(shape, warm + (0 if replay else len(timed)))
        if check:
            self.check_batch(ref_model, shape, staged, timed)
        if not torch.equal(answered, self.read_elements(picks)):
            self.findings.append(
                {
                    "kind": "forged_result",
                    "shape": shape,
                    "detail": f"{shape}: a timed output was written after the candidate's process answered",
                }
            )
            raise GradeFailure(
                Outcome.INCORRECT,
                f"shape {shape}: a timed call's output was still being written after its batch was reported done",
            )
        loop_ms = reply.get("loop_ms")
        figures = {
            "ms": [float(m) for m in ms],
            "loop_ms": float(loop_ms) if isinstance(loop_ms, (int, float)) else None,
            "wall_ms": wall_ms,
            "copy_ms": copy_ms,
            "others_cpu_ms": cpu and cpu["others_ms"],
            "split_ms": reply["split_ms"],
        }
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
        answered = time.perf_counter()
        reply["split_ms"] = split_ms(copied, reply.get("stamps"), answered)
        return (answered - t0) * 1e3, (copied - t0) * 1e3, reply

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
                    raise GradeFailure(
                        Outcome.INCORRECT,
                        f"timed call {i} of a batch, shape {shape}: output left unwritten or not finite",
                    )
        for pick in sorted(self.rng.sample(range(len(slots)), min(PICKS, len(slots)))):
            expected = ref_model(*clone(staged[pick]))
            try:
                self.verify(staged[pick], expected, self.read(slots[pick], expected))
            except checks.CheckFailure as exc:
                raise GradeFailure(Outcome.INCORRECT, f"timed call {pick} of a batch, shape {shape}: {exc}") from None


def split_ms(copied: float, stamps: Any, answered: float) -> List[Optional[float]]:
    """Where a batch's wall went besides the copies, from the runner's monotonic stamps (evidence, never a figure):
    the go's way there, the runner's sync before its loop, its work after the loop, the reply's way back (ms)."""
    if not (isinstance(stamps, list) and len(stamps) == 4 and all(isinstance(t, float) for t in stamps)):
        return [None] * 4
    entered, began, synced, returned = stamps
    return [
        round((t1 - t0) * 1e3, 4)
        for t0, t1 in ((copied, entered), (entered, began), (synced, returned), (returned, answered))
    ]
