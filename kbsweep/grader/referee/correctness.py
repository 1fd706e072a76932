"""The correctness stage: the candidate's outputs over shapes x seeds x stress cases, compared in the referee with the
reference's, then the stale-memory and pointer-cache probes."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Tuple

import torch

from kbsweep.grader.referee import checks
from kbsweep.grader.referee.candidate import CandidateContext, is_float
from kbsweep.grader.shared.arena import clone, encode
from kbsweep.grader.shared.failures import GradeFailure
from kbsweep.outcomes import Outcome


class CorrectnessStage(CandidateContext):
    """Every case's call there, its outputs compared here; any mismatch fails the grade as incorrect."""

    def check_case(
        self,
        ref_model,
        model: int,
        inputs: List[Any],
        tolerance: Optional[Dict] = None,
        encoded: Optional[Dict[str, Any]] = None,
        expected: Any = None,
    ) -> Tuple[Any, Dict[str, float], Any]:
        """One call there on copies of ``inputs``, prepared as a timed call is (its memory as the calls before it
        left it, nothing filled), its outputs read back and compared here with ``expected`` (the reference's output on
        ``inputs``, run now when not known). Returns (out, worst, expected)."""
        mark = self.arena.used
        encoded = encoded or encode(inputs, self.arena)
        expected = ref_model(*clone(inputs)) if expected is None else expected
        slots = self.output_slots(expected)
        self.ask("call", model=model, inputs=encoded, outputs=slots)
        self.count_work(self.shape, 1)
        out = self.read(slots, expected)
        for i, (sent, pristine) in enumerate(zip(encoded["list"], inputs)):
            if "slot" in sent and not checks.same_values(self.arena.view(sent["slot"]), pristine):
                raise checks.CheckFailure(f"the candidate modified input {i}")
        worst = self.verify(inputs, expected, out, tolerance)
        self.arena.used = mark
        return out, worst, expected

    def correctness(self) -> Dict[str, Any]:
        seeds = [42 + 1000 * i for i in range(self.spec.get("seeds", 3))] + [self.secret_seed]
        stress = [{"name": "nominal", "input_scale": 1.0, "weight_scale": 1.0, "tolerance": None}] + list(
            self.spec.get("stress", [])
        )
        cases, worst = 0, {"max_abs": 0.0, "max_rel": 0.0}
        try:
            for s_index, shape in enumerate(self.req.shapes):
                self.shape, self.tag = (
                    shape,
                    f"/correctness/{s_index}",
                )  # a group of calls per shape (kbsweep.grader.referee.witness)
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
                        if case is stress[0]:  # nominal: the stale-memory and pointer-cache probes' inputs and model
                            nominal = (out, expected)
                        worst = {key: max(worst[key], err[key]) for key in worst}
                        cases += 1
                    if s_index == 0 and k == 0:
                        self.stale_memory_probe(ref_model, model, shape, seed, *nominal)
                        self.pointer_cache_probe(ref_model, model, shape, seed, nominal[1])
                    self.arena.used = mark
        except checks.CheckFailure as exc:
            raise GradeFailure(
                Outcome.INCORRECT, f"shape {shape}, seed {'secret' if seed == self.secret_seed else seed}: {exc}"
            ) from None
        return {"passed": True, "cases": cases, "seeds": len(seeds), "worst": worst}

    def scaled(self, ref_model: Any, factor: float) -> Any:
        """The reference with its float weights scaled (a copy: the original stays as built)."""
        if factor == 1.0:
            return ref_model
        model = copy.deepcopy(ref_model)
        for tensor in list(model.parameters()) + list(model.buffers()):
            if is_float(tensor):
                tensor.data.mul_(factor)
        return model

    def stale_memory_probe(self, ref_model, model: int, shape, seed, first: Any, expected: Any) -> None:
        """The nominal case's inputs again, after a checked call on other inputs (the first timing inputs, whose
        output is known for the first seed's weights): output that depends on memory the call read before writing
        it (what the call before it left there, which differs now) shows up here. No call's memory is filled (a fill
        only some calls got would tell them from timed calls); what the call before left is the poison. ``first``:
        the nominal case's output, whose reference output is ``expected``."""
        self.check_case(
            ref_model, model, self.inputs(shape, 2026), expected=self.first_output(shape) if seed == 42 else None
        )
        second, _, _ = self.check_case(ref_model, model, self.inputs(shape, seed), expected=expected)
        same = checks.same_values(first, second)
        self.evidence["poison_deterministic"] = same
        if not same:
            self.findings.append({"kind": "nondeterministic_under_poison", "shape": shape})

    def pointer_cache_probe(self, ref_model, model: int, shape, seed, expected: Any) -> None:
        """Eleven calls on the same input slots, then a few of their elements swapped in place, then the slots
        overwritten in place: the output must follow each change.
        ``expected``: the reference's output on the first inputs (the nominal case's)."""
        mark = self.arena.used
        inputs = self.inputs(shape, seed)
        encoded = encode(inputs, self.arena)
        slots = self.output_slots(expected)
        for _ in range(11):
            self.ask("call", model=model, inputs=encoded, outputs=slots)
        # a few elements swapped within one row (what a cache of part of the input misses), then new inputs
        self.refill_and_check(
            ref_model,
            model,
            encoded,
            self.nudged(inputs),
            "a few input elements changed in place (a cache of part of the input?)",
        )
        self.refill_and_check(
            ref_model, model, encoded, self.inputs(shape, seed + 1), "inputs changed in place (a pointer-keyed cache?)"
        )
        self.count_work(shape, 11)
        self.arena.used = mark
        self.evidence["pointer_cache_probe"] = "passed"

    def refill_and_check(self, ref_model, model: int, encoded: Dict[str, Any], values: List[Any], change: str) -> None:
        """Overwrite the input slots already sent with ``values`` in place, then check the next call's output on them."""
        for sent, value in zip(encoded["list"], values):
            if "slot" in sent:
                self.arena.view(sent["slot"]).copy_(value)
        try:
            self.check_case(ref_model, model, values, encoded=encoded)
        except checks.CheckFailure as exc:
            raise checks.CheckFailure(f"stale output after {change}: {exc}") from None

    def nudged(self, inputs: List[Any], pairs: int = 4) -> List[Any]:
        """``inputs`` with ``pairs`` element pairs of each float tensor swapped within one row drawn now (row sums and
        value sets hold, so a problem's invariants do)."""
        out = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
        for t in out:
            if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() and t.shape[-1] >= 2 * pairs):
                continue
            row = t.reshape(-1, t.shape[-1])[self.rng.randrange(t.numel() // t.shape[-1])]
            picked = self.rng.sample(range(t.shape[-1]), 2 * pairs)
            a, b = torch.tensor(picked[:pairs], device=t.device), torch.tensor(picked[pairs:], device=t.device)
            row[a], row[b] = row[b].clone(), row[a].clone()
        return out
