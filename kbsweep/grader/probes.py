"""The audit's probes: ghost replays of the candidate's calls, and its runner's own records (runtime events, torch
ops, kernel launches, each timed shape's profile), kept as evidence after sanitizing: they come from the candidate's process."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Dict, Sequence

from kbsweep.grader import checks
from kbsweep.grader.arena import encode
from kbsweep.grader.candidate import CandidateContext
from kbsweep.grader.failures import GradeFailure
from kbsweep.outcomes import Outcome

MAX_EVENTS = 60


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




class ProbeStage(CandidateContext):
    """The audit's probes and the runner's records, as evidence (the ghost replays' real call is the correctness
    stage's ``check_case``: they run within a :class:`~kbsweep.grader.referee.Referee`)."""

    def audit_probes(self) -> None:
        """Ghost replays on the first shape: the candidate's kernel launches stubbed there, fresh allocations
        poisoned; whether the output changed is decided here, against the real call's output."""
        shape = self.req.shapes[0]
        self.shape = shape
        self.open_arena(self.arena_size(shape))
        ref_model = self.build(shape, 42)
        models = [self.send_model(ref_model, shape, 42) for _ in range(2)]
        inputs = self.inputs(shape, 2026)
        try:
            real, _, _ = self.check_case(ref_model, models[0], inputs, expected=self.first_output(shape))
        except checks.CheckFailure as exc:
            raise GradeFailure(Outcome.INCORRECT, f"audit probe, shape {shape}: {exc}")
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
        shape = self.req.shapes[0]
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


    @staticmethod
    def deck_hashes(deck: Path) -> Dict[str, str]:
        """Each file of the deck by its hash: what the grade changed there is evidence."""
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(deck.iterdir()) if p.is_file()}
