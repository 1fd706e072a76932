"""The referee's shared candidate context: the request, the channel to the candidate's runner, the arena they
share, the reference's models and inputs, and the clock of each stage.

The stages of a grade (:mod:`kbsweep.grader.referee.correctness`, :mod:`kbsweep.grader.referee.timing_stage`,
:mod:`kbsweep.grader.referee.probes`) build on :class:`CandidateContext`; :class:`kbsweep.grader.referee.referee.Referee` runs
them in order. Everything here runs in the trusted referee process: it never imports candidate code.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import secrets
import time
from dataclasses import replace
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from kbsweep.config import kernelbench
from kbsweep.grader.referee import checks
from kbsweep.grader.referee.request import RefereeRequest
from kbsweep.grader.shared import profiling, timing
from kbsweep.grader.shared.arena import Arena, clone, encode, nbytes, padded, seed_rng
from kbsweep.grader.shared.channel import Channel, ChannelError
from kbsweep.grader.shared.failures import GradeFailure
from kbsweep.outcomes import Outcome

MAX_EVENTS = 60  # runtime events kept from the runner's stream, and from its own record
CANDIDATE_OUTCOMES = (Outcome.INCORRECT, Outcome.COMPILE_ERROR, Outcome.RUNTIME_ERROR, Outcome.GRADE_OOM)
CALL_BUDGET = {"cuda": 4 << 30, "cpu": 256 << 20}  # input sets and output slots of one timed batch
SCALABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # fp8 has no arithmetic (scales)


def is_float(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in SCALABLE


class CandidateContext:
    """What every stage of a grade works with: the request, the runner, the arena, the reference's models and
    inputs, findings and evidence, and the clock of each stage."""

    ref: ModuleType  # the reference, loaded by the referee's run
    shape: Dict[str, Any]  # the shape the current stage calls on, set by the stage
    _stage: str
    _since: float

    def __init__(self, request: RefereeRequest, runner: Channel):
        if request.secret_seed is None:  # the grade's hidden inputs and picks are drawn from it
            raise ValueError("the referee's request holds no secret seed")
        self.secret_seed: int = request.secret_seed
        self.req, self.runner = replace(request, secret_seed=None), runner  # the seed is held here only, never echoed
        self.spec = request.spec
        self.device = torch.device(request.device)
        self.rng = random.Random(
            self.secret_seed * 7 + 1
        )  # batch seeds, sampled elements, picks: never sent ahead of use
        self.findings: List[Dict[str, Any]] = []
        self.evidence: Dict[str, Any] = {}
        self.stages: Dict[str, Dict[str, float]] = {}  # per stage: seconds, candidate and reference forwards
        self.stage, self.tag = "load_reference", ""
        self.calls_by_tag: Dict[str, int] = {}
        self.commands: Dict[
            str, tuple
        ] = {}  # each command's id: (stage, tag, shape, model) it served (the runner sees the id only)
        self.model_in_use: Optional[int] = None
        self.model_ids = itertools.count()
        self.current_arena: Optional[Arena] = None  # the shape's, from ``open_arena``
        self.work = {"calls": 0, "flops": 0.0, "bytes": 0.0}  # what the candidate's calls should cost, summed
        self.barrier: Optional[Callable[[], None]] = (
            None  # ranks: across the referee ranks, as the runner ranks have theirs
        )
        # A KernelBench problem: both models in training mode, built from the same seed, weights never copied
        self.kernelbench = kernelbench.from_spec(self.spec)
        host_runs = timing.KERNELBENCH_HOST_RUNS if self.kernelbench else timing.HOST_MAX_RUNS
        self.cfg = timing.for_device(timing.TimingConfig(**request.timing), self.device.type, host_runs)
        # per shape: (arena size, the reference's output on the first timing inputs), computed once a grade
        self.firsts: Dict[str, tuple] = {}
        self.kernelbench_verdict: Optional[Dict[str, Any]] = None
        self.profile: Optional[Dict[str, Any]] = None  # a profile grade's view of its timed calls (profile_view)

    @property
    def arena(self) -> Arena:
        if self.current_arena is None:
            raise RuntimeError("no arena: a stage opens its shape's before it sends tensors")
        return self.current_arena

    @property
    def stage(self) -> str:
        return self._stage

    @stage.setter
    def stage(self, name: str) -> None:
        """Entering a stage closes the last one's clock (``stages``: where a grade's time and forwards go)."""
        now = time.perf_counter()
        if getattr(self, "_stage", None) is not None:
            self.tally()["s"] += now - self._since
        self._stage, self._since = name, now

    def tally(self) -> Dict[str, float]:
        return self.stages.setdefault(self._stage, {"s": 0.0, "candidate_calls": 0, "reference_calls": 0})

    def count_reference(self) -> None:
        self.tally()["reference_calls"] += 1

    # -- the runner -------------------------------------------------------------------
    def ask(self, op: str, fds: Sequence[int] = (), **fields: Any) -> Dict[str, Any]:
        """One command, under an id drawn for it alone: the runner never learns which stage or shape a call serves
        (``commands`` holds that here). Events the runner's monitor sends on the way are kept as they come. A failed
        reply raises its outcome (only the candidate's own outcomes are believed)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # what this process wrote to the arena is there before the runner reads it
        token = secrets.token_hex(profiling.TOKEN_CHARS // 2)
        self.model_in_use = fields.get("model", self.model_in_use)  # a batch's go runs the model its arm named
        self.commands[token] = (self.stage, self.tag, getattr(self, "shape", None), self.model_in_use)
        try:
            self.runner.send({"op": op, "tag": token, **fields}, fds)
            reply, extra = self.runner.receive()
            while "event" in reply:  # sent the moment it happened: nothing the candidate does later takes it back
                self.streamed(reply["event"])
                reply, extra = self.runner.receive()
        except ChannelError as exc:
            if "closed" not in str(exc):
                self.findings.append({"kind": "forged_result", "detail": str(exc)[:200]})
            raise GradeFailure(
                Outcome.RUNTIME_ERROR, f"{self.stage}: the candidate's process died or broke the channel ({exc})"
            ) from None
        for fd in extra:
            os.close(fd)
        if not reply.get("ok"):
            outcome = reply.get("outcome")
            message = str(reply.get("message")).replace(token, self.stage)  # the runner names the command by its id
            raise GradeFailure(
                Outcome(outcome) if outcome in CANDIDATE_OUTCOMES else Outcome.RUNTIME_ERROR, message[:500]
            )
        return reply

    def streamed(self, event: Any) -> None:
        """A reach event of the runner's monitor (frames or the heap read, a class patched, the harness's private
        event raised by foreign code), kept with this grade's evidence."""
        events = self.evidence.setdefault("runtime_events", [])
        entry = self.event_entry(event)
        if entry is not None and entry not in events and len(events) < MAX_EVENTS:
            events.append(entry)

    def event_entry(self, event: Any) -> Optional[Dict[str, str]]:
        """A runtime event from the runner with only the fields the audit reads, its stage named here."""
        if not isinstance(event, dict):
            return None
        entry = {key: str(event.get(key))[:300] for key in ("kind", "event", "detail", "where", "stage")}
        entry["stage"] = self.stage_of(entry["stage"])
        return entry

    def stage_of(self, token: str) -> str:
        """The stage a command id served (the runner records its events under the id)."""
        return self.commands[token][0] if token in self.commands else token

    def open_arena(self, size: int) -> None:
        """The next shape's arena. The runner first lets go of the last one and of every model built from it (no
        model is called across arenas), so a grade holds one shape's memory at a time, and the GPU memory the
        runner's allocator kept is back with the driver before the new arena is taken from it."""
        if self.current_arena is not None:
            self.ask("release")
            self.current_arena.close()
        self.current_arena = Arena.create(size, self.device)
        self.ask("arena", fds=[self.arena.fd], size=self.arena.size)

    def arena_size(self, shape: Dict[str, Any]) -> int:
        """State + timing input sets + a batch's output slots, from one build of the reference."""
        return self.first(shape)[0]

    def first_output(self, shape: Dict[str, Any]) -> Any:
        """The reference's output on the first timing inputs (seed 2026), from a model fresh from seed 42: what
        the timed calls and the audit's real call are compared with."""
        return self.first(shape)[1]

    def first(self, shape: Dict[str, Any]) -> tuple:
        """(arena size, first output) of ``shape``: one build and one forward of the reference, not one per stage."""
        key = json.dumps(shape, sort_keys=True)
        if key not in self.firsts:
            ref_model = self.build(shape, 42)
            first = self.inputs(shape, 2026)
            expected = ref_model(*clone(first))
            state = sum(padded(nbytes(t)) for t in ref_model.state_dict().values())
            ins = sum(padded(nbytes(t)) for t in first if isinstance(t, torch.Tensor))
            outs = sum(padded(nbytes(t)) for t in checks.as_tuple(expected))
            calls = self.calls_cap(first, expected)
            self.firsts[key] = (
                2 * state + max(self.set_count(first), calls, 4) * ins + (calls + 4) * outs + (1 << 20),
                expected,
            )
        return self.firsts[key]

    def send_model(self, ref_model: Any, shape: Dict[str, Any], seed: int) -> int:
        """The candidate's ModelNew built there under ``seed``, loaded with a copy of the reference's weights (a
        KernelBench problem's is not: its weights come from the seed alone, as in KernelBench)."""
        model = next(self.model_ids)
        state = None if self.kernelbench else {name: self.arena.put(t) for name, t in ref_model.state_dict().items()}
        init = encode(list(self.ref.get_init_inputs(dict(shape))), self.arena)
        self.ask("build", model=model, seed=self.rank_seed(seed), init=init, state=state, train=bool(self.kernelbench))
        return model

    def output_slots(self, expected: Any) -> List[Dict[str, Any]]:
        """Slots for one call's outputs, poisoned (0xFF: NaN in every float format) so an unwritten one shows."""
        slots = [self.arena.alloc(t.dtype, list(t.shape)) for t in checks.as_tuple(expected)]
        self.poison_slots(slots)
        return slots

    def read(self, slots: List[Dict[str, Any]], like: Any) -> Any:
        outs = tuple(self.arena.view(s).clone() for s in slots)
        return outs if isinstance(like, (tuple, list)) else outs[0]

    def verify(self, inputs: List[Any], expected: Any, out: Any, tolerance: Optional[Dict] = None) -> Dict[str, float]:
        """A compared call's outputs against the reference's on ``inputs``, the problem's ``check_outputs`` included
        (:func:`kbsweep.grader.referee.checks.verify`). Returns the worst errors seen."""
        return checks.verify(
            expected, out, clone(inputs), self.spec["tolerance"], tolerance, getattr(self.ref, "check_outputs", None)
        )

    def count_work(self, shape: Dict[str, Any], calls: int) -> None:
        from kbsweep.config.problems import evaluate

        self.work["calls"] += calls
        self.calls_by_tag[self.tag] = self.calls_by_tag.get(self.tag, 0) + calls
        self.tally()["candidate_calls"] += calls
        for key in ("flops", "bytes"):
            self.work[key] += calls * float(evaluate(self.spec.get(key), shape, key) or 0.0)

    # -- building models and inputs -------------------------------------------------
    def rank_seed(self, seed: int) -> int:
        """The seed torch's global RNG gets for ``seed`` (ranks: a stream of their own)."""
        return seed

    def build(self, shape: Dict[str, Any], seed: int):
        init = self.ref.get_init_inputs(dict(shape))
        seed_rng(self.rank_seed(seed), self.device)  # after the init inputs, as the runner seeds before ModelNew(*init)
        model = self.ref.Model(*init).to(self.device)
        model.register_forward_pre_hook(
            lambda module, args: self.count_reference()
        )  # a closure: scaled()'s deepcopy keeps it
        return model.train() if self.kernelbench else model.eval()

    def inputs(self, shape: Dict[str, Any], seed: int, scale: float = 1.0) -> List[Any]:
        seed_rng(self.rank_seed(seed + 7919), self.device)
        values = list(self.ref.get_inputs(dict(shape), self.device))
        return [v * scale if is_float(v) and scale != 1.0 else v for v in values]

    def set_count(self, first: Sequence[Any]) -> int:
        size = sum(nbytes(t) for t in first if isinstance(t, torch.Tensor))
        return timing.input_set_count(size, self.req.l2_bytes if self.device.type == "cuda" else 0)

    def calls_cap(self, inputs: Sequence[Any], expected: Any) -> int:
        """Timed calls a batch may hold: each has an input set and output slots of its own, within CALL_BUDGET."""
        per_call = sum(padded(nbytes(t)) for t in [*inputs, *checks.as_tuple(expected)] if isinstance(t, torch.Tensor))
        most = timing.MAX_BATCH_CALLS if self.device.type == "cuda" else timing.SYNCED_BATCH_CALLS
        return max(2, min(most, CALL_BUDGET[self.device.type] // max(per_call, 1)))

    # -- what ranks agree on (one process: itself) ----------------------------------
    def any_rank(self, flag: bool) -> bool:
        return flag

    def agreed_batch(self, shape_: Dict[str, float]) -> Dict[str, float]:
        """Calls per batch and spin, the same on every rank."""
        return shape_

    def slowest(self, ms: List[float], elapsed_s: float, runner_ms: Sequence[float] = ()) -> tuple:
        """(each figure, time spent): the slowest rank's. ``runner_ms``: the runner's own call times, kept per rank
        as evidence of which rank is slow (the ranks wait for each other, so the referee's clocks agree)."""
        return ms, elapsed_s

    def poison_slots(self, slots: List[Dict[str, Any]]) -> None:
        """0xFF bytes (NaN in every float format) in output slots, so an unwritten one shows."""
        for slot in slots:
            view = self.arena.view(slot)
            if view.numel():
                view.view(-1).view(torch.uint8).fill_(0xFF)
