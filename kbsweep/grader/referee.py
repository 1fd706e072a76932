"""The trusted side of a grade: a process that never imports candidate code.

Run by :func:`kbsweep.grader.supervise` as ``python -m kbsweep.grader.referee <result fd> <runner fd>``. It holds
the grade request (the secret seed included), loads the reference, times the baselines, makes every input,
keeps the reference's weights and outputs to itself, compares, owns the clock that corroborates time, and writes
the one result message. The candidate runs in another process (:mod:`kbsweep.grader.runner`) that gets inputs
and its own copies of the weights through shared memory (:mod:`kbsweep.grader.arena`) and writes its outputs
there; commands and replies cross a JSON channel (:mod:`kbsweep.grader.channel`). What the runner reports
(times, structure, evidence) is untrusted: times are checked against this process's clock, outputs of calls
picked after each timed batch are checked against the reference, evidence is sanitized and kept as evidence.
"""
from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from kbsweep.grader import checks, kernelbench_eval, timing
from kbsweep.grader.arena import Arena, apply_swaps, nbytes, padded, prepared_swaps
from kbsweep.grader.channel import Channel, ChannelError
from kbsweep.grader.failures import GradeFailure, one_line

CANDIDATE_OUTCOMES = ("incorrect", "compile_error", "runtime_error", "grade_oom")
OUTPUT_BUDGET = {"cuda": 4 << 30, "cpu": 256 << 20}  # output slots of one timed batch
PICKS = 2  # calls of each timed batch whose outputs are compared with the reference after it
SWAPS = 4  # canary pairs per float input and call
# The referee's clock against the runner's figures, per timing mode: the batch's wall time, less what the
# referee measured of everything else it contains (spin, flushes, output copies, the channel's round trip) and a
# slack, over the runner's summed call times; past this ratio (median over batches) the runner's figures are
# not believed.
BAND = {"back_to_back": 1.15, "isolated": 1.5, "host": 1.5}
MAX_EVENTS = 60


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def encode(value: Any, arena: Arena) -> Dict[str, Any]:
    """A value for the runner: tensors as arena slots (copies), dtypes by name, lists element-wise."""
    if isinstance(value, torch.Tensor):
        return {"slot": arena.put(value)}
    if isinstance(value, (list, tuple)):
        return {"list": [encode(v, arena) for v in value]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    return {"value": value}


def clone(values: Sequence[Any]) -> List[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


SCALABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # fp8 has no arithmetic (scales, canaries)


def is_float(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in SCALABLE


def sanitized(evidence: Any) -> Dict[str, Any]:
    """The runner's evidence with only the shapes the audit reads (it comes from the candidate's process)."""
    evidence = evidence if isinstance(evidence, dict) else {}
    text = lambda v: str(v)[:300]  # noqa: E731
    events = [e for e in evidence.get("runtime_events") or [] if isinstance(e, dict)][:MAX_EVENTS]
    threads = [t for t in evidence.get("threads") or [] if isinstance(t, dict)][:MAX_EVENTS]
    flags = evidence.get("global_flags") if isinstance(evidence.get("global_flags"), dict) else {}
    return {
        "runtime_events": [{k: text(e.get(k)) for k in ("kind", "event", "detail", "where", "stage")} for e in events],
        "threads": [{"where": text(t.get("where")), "stage": text(t.get("stage")), "running": bool(t.get("running")),
                     "outlived_call": bool(t.get("outlived_call"))} for t in threads],
        "global_flags": {text(k): [text(v[0]), text(v[-1])] for k, v in list(flags.items())[:20] if isinstance(v, list) and v},
    }


def counts(value: Any) -> Dict[str, int]:
    value = value if isinstance(value, dict) else {}
    return {str(k)[:200]: int(v) for k, v in list(value.items())[:500] if isinstance(v, (int, float))}


class Referee:
    """Correctness over shapes × seeds × stress cases, then timing of baselines (here) and candidate (there)."""

    def __init__(self, request: Dict[str, Any], runner: Channel):
        self.req, self.runner = request, runner
        self.spec = request["spec"]
        self.device = torch.device(request["device"])
        self.secret_seed = request.pop("secret_seed")
        self.rng = random.Random(self.secret_seed * 7 + 1)  # batch seeds, canaries, picks: never sent ahead of use
        self.findings: List[Dict[str, Any]] = []
        self.evidence: Dict[str, Any] = {}
        self.stages: Dict[str, Dict[str, float]] = {}  # per stage: seconds, candidate and reference forwards
        self.stage, self.tag = "load_reference", ""
        self.calls_by_tag: Dict[str, int] = {}
        self.model_ids = itertools.count()
        self.arena: Optional[Arena] = None
        self.work = {"calls": 0, "flops": 0.0, "bytes": 0.0}  # what the candidate's calls should cost, summed
        self.barrier: Optional[Callable[[], None]] = None  # ranks: across the referee ranks, as the runner ranks have theirs
        # A KernelBench problem: both models in training mode, built from the same seed, weights never copied
        self.kernelbench = kernelbench_eval.from_spec(self.spec)
        self.cfg = timing.for_device(timing.TimingConfig(**request.get("timing", {})), self.device.type)
        # per shape: (arena size, the reference's output on the first timing inputs), computed once a grade
        self.firsts: Dict[str, tuple] = {}
        self.kernelbench_verdict: Optional[Dict[str, Any]] = None

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
        """One command; a failed reply raises its outcome (only the candidate's own outcomes are believed)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # what this process wrote to the arena is there before the runner reads it
        try:
            self.runner.send({"op": op, "stage": self.stage, "tag": self.tag, **fields}, fds)
            reply, extra = self.runner.receive()
        except ChannelError as exc:
            if "closed" not in str(exc):
                self.findings.append({"kind": "forged_result", "detail": str(exc)[:200]})
            raise GradeFailure("runtime_error", f"{self.stage}: the candidate's process died or broke the channel ({exc})") from None
        for fd in extra:
            os.close(fd)
        if not reply.get("ok"):
            outcome = reply.get("outcome") if reply.get("outcome") in CANDIDATE_OUTCOMES else "runtime_error"
            raise GradeFailure(outcome, str(reply.get("message"))[:500])
        return reply

    def open_arena(self, size: int) -> None:
        if self.arena is not None:
            self.arena.close()
        self.arena = Arena.create(size, self.device)
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
            self.firsts[key] = (2 * state + max(self.set_count(first), 4) * ins + (self.calls_cap(outs) + 4) * outs + (1 << 20), expected)
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

    def count_work(self, shape: Dict[str, Any], calls: int) -> None:
        from kbsweep.problems import evaluate

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
        torch.manual_seed(self.rank_seed(seed))  # after the init inputs, as the runner seeds before ModelNew(*init)
        model = self.ref.Model(*init).to(self.device)
        model.register_forward_pre_hook(lambda module, args: self.count_reference())  # a closure: scaled()'s deepcopy keeps it
        return model.train() if self.kernelbench else model.eval()

    def inputs(self, shape: Dict[str, Any], seed: int, scale: float = 1.0) -> List[Any]:
        torch.manual_seed(self.rank_seed(seed + 7919))
        values = list(self.ref.get_inputs(dict(shape), self.device))
        return [v * scale if is_float(v) and scale != 1.0 else v for v in values]

    def set_count(self, first: Sequence[Any]) -> int:
        size = sum(nbytes(t) for t in first if isinstance(t, torch.Tensor))
        return timing.input_set_count(size, self.req["l2_bytes"] if self.device.type == "cuda" else 0, self.req.get("max_input_bytes", 8 << 30))

    def calls_cap(self, out_bytes: int) -> int:
        return max(2, min(32, OUTPUT_BUDGET[self.device.type] // max(out_bytes, 1)))

    # -- what ranks agree on (one process: itself) ----------------------------------
    def any_rank(self, flag: bool) -> bool:
        return flag

    def agreed_batch(self, shape_: Dict[str, float]) -> Dict[str, float]:
        """Calls per batch and spin, the same on every rank."""
        return shape_

    def slowest(self, ms: List[float], elapsed_s: float) -> tuple:
        """(each call's time, time spent): the slowest rank's."""
        return ms, elapsed_s

    # -- the stages -----------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        t0, started_at = time.perf_counter(), time.time()  # the grade's start-up ends here: both processes are up
        deck = Path(self.req["reference"]).parent
        hashes = self.deck_hashes(deck)
        self.ref = load_module("kbsweep_reference", Path(self.req["reference"]))
        timed = self.req["mode"] in ("bench", "full")
        baselines: List[Dict[str, Any]] = []
        if self.device.type == "cuda":  # a persisting-L2 carve-out an earlier process left on the GPU is not this candidate's
            from kbsweep.audit import runtime

            self.evidence["persisting_l2_inherited"] = runtime.persisting_l2_limit()
            timing.reset_persisting_l2()
        if timed and self.req.get("baselines"):
            self.stage = "baselines"  # before the candidate is imported: it cannot touch what its speedups divide by
            deadline = time.perf_counter() + self.req.get("baseline_budget_s", math.inf)  # one budget for all shapes
            with torch.no_grad():
                baselines = [self.time_baselines(shape, deadline) for shape in self.req["shapes"]]
        self.stage, self.tag = "import_candidate", "/import"
        self.ask("import")
        with torch.no_grad():
            if self.kernelbench:  # KernelBench's verdict first, whatever kbsweep's own checks then find
                self.stage = "kernelbench_correctness"
                self.kernelbench_verdict = kernelbench_eval.run(self, self.kernelbench)
            self.stage, self.tag = "correctness", "/correctness"
            try:
                correctness = self.correctness()
            except GradeFailure as failure:
                if timed and failure.outcome == "incorrect" and (self.kernelbench_verdict or {}).get("correctness"):
                    self.kernelbench_verdict["candidate_timing"] = self.kernelbench_timing(baselines)
                raise
            timings = []
            if timed:
                self.stage = "timing"
                timings = []
                for index, shape in enumerate(self.req["shapes"]):
                    self.tag = f"/timing/{index}"
                    timings.append(self.time_shape(shape))
                for entry, base in zip(timings, baselines or [{}] * len(timings)):
                    entry["baselines"] = base
            self.stage, self.tag = "audit", "/audit"
            self.audit_probes()
        self.collect_evidence(timings)
        self.evidence["files_modified"] = sorted(p for p, h in self.deck_hashes(deck).items() if hashes.get(p) != h)
        return {"correctness": correctness, "timings": timings, "evidence": self.evidence, "findings": self.findings,
                "kernelbench": self.kernelbench_verdict, "worker_s": time.perf_counter() - t0, "started_at": started_at}

    @staticmethod
    def deck_hashes(deck: Path) -> Dict[str, str]:
        import hashlib

        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(deck.iterdir()) if p.is_file()}

    # -- correctness ----------------------------------------------------------------
    def check_case(self, ref_model, model: int, inputs: List[Any], tolerance: Optional[Dict] = None, fill: int = 0xFF,
                   encoded: Optional[Dict[str, Any]] = None, expected: Any = None):
        """One call there on copies of ``inputs``; its outputs read back and compared here with ``expected`` (the
        reference's output on ``inputs``, run now when not known). Returns (out, worst, expected)."""
        mark = self.arena.used
        encoded = encoded or encode(inputs, self.arena)
        expected = ref_model(*clone(inputs)) if expected is None else expected
        slots = self.output_slots(expected)
        self.ask("call", model=model, inputs=encoded, outputs=slots, fill=fill)
        self.count_work(self.shape, 1)
        out = self.read(slots, expected)
        for i, (sent, pristine) in enumerate(zip(encoded["list"], inputs)):
            if "slot" in sent and not checks.same_values(self.arena.view(sent["slot"]), pristine):
                raise checks.CheckFailure(f"the candidate modified input {i}")
        worst = checks.compare(expected, out, self.spec["tolerance"], tolerance)
        hook = getattr(self.ref, "check_outputs", None)
        try:
            message = hook(clone(inputs), expected, out) if hook is not None else None
        except Exception as exc:  # noqa: BLE001 - the candidate's output made the problem's own check raise
            message = f"the problem's check_outputs rejected the output ({one_line(exc)})"
        if message:
            raise checks.CheckFailure(message)
        self.arena.used = mark
        return out, worst, expected

    def correctness(self) -> Dict[str, Any]:
        seeds = [42 + 1000 * i for i in range(self.spec.get("seeds", 3))] + [self.secret_seed]
        stress = [{"name": "nominal", "input_scale": 1.0, "weight_scale": 1.0, "tolerance": None}] + list(self.spec.get("stress", []))
        cases, worst = 0, {"max_abs": 0.0, "max_rel": 0.0}
        try:
            for s_index, shape in enumerate(self.req["shapes"]):
                self.shape = shape
                self.open_arena(self.arena_size(shape))
                for k, seed in enumerate(seeds):
                    mark = self.arena.used
                    ref_model = self.build(shape, seed)
                    model = self.send_model(ref_model, shape, seed)
                    for case in stress if k == 0 else stress[:1]:
                        factor = case.get("weight_scale", 1.0)
                        scaled = self.scaled(ref_model, factor)
                        target = model if factor == 1.0 else self.send_model(scaled, shape, seed)
                        inputs = self.inputs(shape, seed, case.get("input_scale", 1.0))
                        out, err, expected = self.check_case(scaled, target, inputs, case.get("tolerance"))
                        if case is stress[0]:  # nominal: the poison and pointer-cache probes' inputs, model and fill
                            nominal = (out, expected)
                        worst = {key: max(worst[key], err[key]) for key in worst}
                        cases += 1
                    if s_index == 0 and k == 0:
                        self.poison_determinism(ref_model, model, shape, seed, *nominal)
                        self.pointer_cache_probe(ref_model, model, shape, seed, nominal[1])
                    self.arena.used = mark
        except checks.CheckFailure as exc:
            raise GradeFailure("incorrect", f"shape {shape}, seed {'secret' if seed == self.secret_seed else seed}: {exc}")
        return {"passed": True, "cases": cases, "seeds": len(seeds), "worst": worst}

    def scaled(self, ref_model: Any, factor: float) -> Any:
        """The reference with its float weights scaled (a copy: the original stays as built)."""
        if factor == 1.0:
            return ref_model
        import copy

        model = copy.deepcopy(ref_model)
        for tensor in list(model.parameters()) + list(model.buffers()):
            if is_float(tensor):
                tensor.data.mul_(factor)
        return model

    def poison_determinism(self, ref_model, model: int, shape, seed, first: Any, expected: Any) -> None:
        """Two calls under different poison fills: output that depends on stale memory shows up here. The first is
        the nominal case's (``first``: its output, under 0xFF, on these inputs, whose reference output is ``expected``)."""
        second, _, _ = self.check_case(ref_model, model, self.inputs(shape, seed), fill=0xC7, expected=expected)
        same = checks.same_values(first, second)
        self.evidence["poison_deterministic"] = same
        if not same:
            self.findings.append({"kind": "nondeterministic_under_poison", "shape": shape})

    def pointer_cache_probe(self, ref_model, model: int, shape, seed, expected: Any) -> None:
        """Eleven calls on the same input slots, then the slots overwritten in place: the output must follow.
        ``expected``: the reference's output on the first inputs (the nominal case's)."""
        mark = self.arena.used
        inputs = self.inputs(shape, seed)
        encoded = encode(inputs, self.arena)
        slots = self.output_slots(expected)
        for _ in range(11):
            self.ask("call", model=model, inputs=encoded, outputs=slots)
        fresh = self.inputs(shape, seed + 1)
        for sent, value in zip(encoded["list"], fresh):
            if "slot" in sent:
                self.arena.view(sent["slot"]).copy_(value)
        try:
            self.check_case(ref_model, model, fresh, encoded=encoded)
        except checks.CheckFailure as exc:
            raise checks.CheckFailure(f"stale output after inputs changed in place (a pointer-keyed cache?): {exc}")
        self.count_work(shape, 11)
        self.arena.used = mark
        self.evidence["pointer_cache_probe"] = "passed"

    # -- timing ---------------------------------------------------------------------
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
            entry = self.time_shape(self.req["shapes"][0], kernelbench=True)
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
        if mode != "host" and (mode == "isolated" or timed["median_ms"] < 0.05) and self.req.get("world_size", 1) == 1 and not kernelbench:
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
            raise GradeFailure("runtime_error", "timing: the candidate's process returned no valid call times")
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

    def poison_slots(self, slots: List[Dict[str, Any]]) -> None:
        """0xFF bytes (NaN in every float format) in output slots, so an unwritten one shows."""
        for slot in slots:
            view = self.arena.view(slot)
            if view.numel():
                view.view(-1).view(torch.uint8).fill_(0xFF)

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
                    raise GradeFailure("incorrect", f"timed call {i} of a batch, shape {shape}: output left unwritten or not finite")
        for pick in sorted(self.rng.sample(range(warm, len(plan)), min(PICKS, len(plan) - warm))):
            j = pick % len(sets)
            inputs = self.inputs(shape, seeds[j])
            for i in range(j, pick + 1, len(sets)):
                apply_swaps(inputs, plan[i]["swaps"])
            expected = ref_model(*clone(inputs))
            try:
                checks.compare(expected, self.read(plan[pick]["outputs"], expected), self.spec["tolerance"])
            except checks.CheckFailure as exc:
                raise GradeFailure("incorrect", f"timed call {pick} of a batch, shape {shape}: {exc}")

    def overheads(self, model: int, template: List[Any], sets, expected: Any, mode: str, spin_us: float, calls: int) -> Dict[str, float]:
        """What a batch's wall time holds besides the calls, measured here: the go's round trip (an empty batch
        there), and the same batch run in this process with a call that does nothing (spin, canaries, flushes,
        output copies, syncs); plus a slack."""
        self.ask("arm", model=model, calls=[], mode=mode, spin_us=0)
        parts = {"round_trip_ms": statistics.median(self.timed_go()[0] for _ in range(3))}
        local = clone(template)
        outputs = [torch.empty_like(t) for t in checks.as_tuple(expected)]
        flush = timing.L2Flush(self.req["l2_bytes"]) if mode != "host" else None
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
        others = {name: getattr(timing, f"time_{name}")(fn, sets[0], self.device) for name in self.req.get("timers", [])}
        return {**timed, "timers": others} if others else timed

    def time_here(self, fn: Callable, sets: List[List[Any]]) -> Dict[str, Any]:
        """A trusted callable timed in this process by the same batches the candidate's runner uses."""
        mode = self.timing_mode()
        flush = timing.L2Flush(self.req["l2_bytes"]) if mode != "host" else None
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

    # -- audit ------------------------------------------------------------------------
    def audit_probes(self) -> None:
        """Ghost replays on the first shape: the candidate's kernel launches stubbed there, fresh allocations
        poisoned; whether the output changed is decided here, against the real call's output."""
        shape = self.req["shapes"][0]
        self.shape = shape
        self.open_arena(self.arena_size(shape))
        ref_model = self.build(shape, 42)
        models = [self.send_model(ref_model, shape, 42) for _ in range(2)]
        inputs = self.inputs(shape, 2026)
        try:
            real, _, _ = self.check_case(ref_model, models[0], inputs, expected=self.first_output(shape))
        except checks.CheckFailure as exc:
            raise GradeFailure("incorrect", f"audit probe, shape {shape}: {exc}")
        encoded = encode(inputs, self.arena)
        ghost = {}
        for name, model in (("same_instance", models[0]), ("fresh_instance", models[1])):
            slots = self.output_slots(real)
            record = self.ask("ghost", model=model, inputs=encoded, outputs=slots)
            changed = bool(record.get("error")) or not checks.same_values(real, self.read(slots, real))
            ghost[name] = {"changed": changed, "error": str(record.get("error") or "")[:300] or None, "aliases_previous": False,
                           "stubbed": int(record.get("stubbed") or 0), "graph_replays": int(record.get("graph_replays") or 0)}
        self.evidence["ghost"] = ghost

    def collect_evidence(self, timings: Sequence[Dict[str, Any]] = ()) -> None:
        """The runner's own records: runtime events, torch ops over every call (from its dispatch-mode recorder and
        its profiler session, which also sees ops run with dispatch disabled), kernel launches, and on GPUs each
        timed shape's profiled kernels."""
        from kbsweep.problems import evaluate

        reply = self.ask("evidence", calls=self.calls_by_tag)
        self.stage = self.stage  # closes the clock of the stage it is in
        self.evidence["stages"] = self.stages
        ops = reply.get("ops") if isinstance(reply.get("ops"), dict) else {}
        profiled = reply.get("profiled") if isinstance(reply.get("profiled"), dict) else {}
        self.evidence.update(sanitized(reply.get("evidence")))
        shape = self.req["shapes"][0]
        number = lambda v: float(v) if isinstance(v, (int, float)) else 0.0  # noqa: E731
        probe = {
            "shape": shape,
            "calls": self.work["calls"],
            "launches": counts(reply.get("launches")),
            "kernels": [str(k)[:200] for k in (reply.get("kernels") or [])][:100],
            "aten_ops": counts(ops.get("aten_ops")),
            "profiled_ops": counts(profiled.get("ops")),
            "comm_ops": counts(profiled.get("comm_ops")),  # torch.distributed's, per backend (the multi track's gate)
            "gpu_kernels": [str(k)[:200] for k in (profiled.get("kernels") or [])][:200],
            "own_ops": counts(ops.get("own_ops")),
            "torch_flops": max(number(ops.get("torch_flops")), number(profiled.get("flops"))),
            "torch_bytes": number(ops.get("torch_bytes")),
            "problem_flops": self.work["flops"] or evaluate(self.spec.get("flops"), shape, "probe"),
            "problem_bytes": self.work["bytes"],
            "ghost": self.evidence.pop("ghost", None),
        }
        if self.device.type == "cuda" and isinstance(reply.get("persisting_l2_limit"), int):
            probe["persisting_l2_limit"] = reply["persisting_l2_limit"]
        self.evidence["probe"] = probe
        profiles = profiled.get("profiles") if isinstance(profiled.get("profiles"), dict) else {}
        for index, entry in enumerate(timings):
            found = profiles.get(f"/timing/{index}")
            if self.device.type == "cuda" and isinstance(found, dict):
                entry["profile"] = {"launches_per_call": number(found.get("launches_per_call")),
                                    "kernels": {str(k)[:200]: number(v) for k, v in list((found.get("kernels") or {}).items())[:200]},
                                    "streams": [int(x) for x in found.get("streams") or [] if isinstance(x, int)],
                                    "median_launches": number(found.get("median_launches"))}


def time_baselines(request: Dict[str, Any], ref_model: Any, sets: List[List[Any]], spent: Callable[[], bool], timer: Callable) -> Dict[str, Any]:
    """Eager, torch.compile, SOTA... of ``request`` timed by ``timer(fn, sets)``; one that would start once
    ``spent()`` says the grade's baseline budget is gone (a slow compile must not cost the candidate its grade) is
    left for a later grade. Each but eager is first compared with the reference: one outside the tolerance is timed all the
    same (a library's own precision) and carries ``outside_tolerance``."""
    spec, out = request["spec"], {}
    expected = None  # the reference's output on the first timing inputs, once for every baseline checked against it
    for name in request.get("baselines", []):
        if name in spec.get("skip_baselines", {}):
            out[name] = {"skipped": spec["skip_baselines"][name]}
            continue
        if spent():
            out[name] = {"error": "not timed: the grade's baseline budget was spent", "retry": True}
            continue
        try:
            fn = baseline_callable(name, ref_model, Path(request["reference"]), request.get("compile_mode"))
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


def referee_message(request: Dict[str, Any], runner: Channel, make: Callable[[Dict[str, Any], Channel], Referee]) -> Dict[str, Any]:
    """The grade of ``make(request, runner)``, as the one message the referee writes: its result, or its outcome
    with the stage, findings and the runner's evidence; the runner is told to exit either way."""
    referee = None
    try:
        try:
            runner.send({"request": {k: request[k] for k in ("device", "workdir", "l2_bytes")}})
            runner.receive()
        except ChannelError as exc:  # nothing of the candidate has run yet
            raise GradeFailure("harness_error", f"the candidate's process died before it took the request ({exc})") from None
        referee = make(request, runner)
        message = {"ok": True, "result": referee.run()}
    except GradeFailure as exc:
        message = {"ok": False, "outcome": exc.outcome, "message": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - this process runs no candidate code: anything else is the harness's
        stage = referee.stage if referee else "load_reference"
        message = {"ok": False, "outcome": "harness_error", "message": f"referee, {stage}: {one_line(exc)}"}
        traceback.print_exc()
    if not message["ok"]:
        message["at"] = time.time()  # when it failed: of several ranks' failures, the earliest is the cause
    if referee is not None and not message["ok"]:
        runner.sock.settimeout(30)  # a runner rank stuck in a collective with a failed peer never answers
        try:  # a failed grade keeps the runner's evidence too, when the runner is still there to give it
            referee.collect_evidence()
        except (GradeFailure, ChannelError):
            pass
        message.update(stage=referee.stage, findings=referee.findings, evidence=referee.evidence,
                       kernelbench=referee.kernelbench_verdict)
        if referee.kernelbench and referee.kernelbench_verdict is None and referee.stage == "import_candidate":
            message["kernelbench"] = kernelbench_eval.not_compiled(referee.kernelbench, message["message"])
    try:
        runner.send({"op": "exit"})
    except ChannelError:
        pass
    return message


def main() -> None:
    channel = os.fdopen(int(sys.argv[1]), "w")
    request = json.loads(sys.stdin.read())
    message = referee_message(request, Channel.from_fd(int(sys.argv[2])), Referee)
    channel.write(json.dumps(message, default=str) + "\n")
    channel.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
