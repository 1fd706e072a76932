"""The audit's probes: ghost replays of the candidate's calls, and its runner's own records (runtime events, torch
ops, kernel launches, each call's work, each timed shape's profile), kept as evidence after sanitizing: they come
from the candidate's process. What the referee can check of them itself it does here: the records against the
calls it made (:mod:`kbsweep.grader.referee.witness`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Dict, Sequence

from kbsweep.grader.referee import checks, witness
from kbsweep.grader.referee.candidate import MAX_EVENTS
from kbsweep.grader.referee.correctness import CorrectnessStage
from kbsweep.grader.referee.profile_view import profile_view
from kbsweep.grader.shared import profiling
from kbsweep.grader.shared.arena import encode
from kbsweep.grader.shared.failures import GradeFailure
from kbsweep.outcomes import Outcome


def fields(value: Any) -> Dict[str, Any]:
    """``value`` where the runner sent an object, else nothing: its records may hold anything."""
    return value if isinstance(value, dict) else {}


def counts(value: Any) -> Dict[str, int]:
    return {str(k)[:200]: int(v) for k, v in list(fields(value).items())[:500] if isinstance(v, (int, float))}


class ProbeStage(CorrectnessStage):
    """The audit's probes and the runner's records, as evidence (the ghost replays' real call is the correctness
    stage's ``check_case``)."""

    def audit_probes(self) -> None:
        """Ghost replays on the first shape, each a call prepared as any call is, with the candidate's kernel launches
        stubbed there: first a checked call on an instance (its one-time preparation done, its buffers taken), then
        a ghost on that instance and one on a fresh one, both on inputs drawn now that no call has seen, then a
        checked call on those inputs. Nothing in the runner's memory held that call's output before it ran, so a
        ghost whose output equals it computed it without the stubbed kernels (torch, an unseen launch); an honest
        one's output is whatever its unwritten buffers held. Decided here, against the checked call's output."""
        shape = self.req.shapes[0]
        self.shape = shape
        self.open_arena(self.arena_size(shape))
        ref_model = self.build(shape, 42)
        models = [self.send_model(ref_model, shape, 42) for _ in range(2)]
        template = self.first_output(shape)
        inputs = self.inputs(shape, self.rng.randrange(2**31))
        try:
            self.check_case(ref_model, models[0], self.inputs(shape, 2026), expected=template)
            ghost, outs, mark = {}, {}, self.arena.used
            for name, model in (("same_instance", models[0]), ("fresh_instance", models[1])):
                slots = self.output_slots(template)
                record = self.ask("ghost", model=model, inputs=encode(inputs, self.arena), outputs=slots)
                self.count_work(shape, 1)
                outs[name] = None if record.get("error") else self.read(slots, template)
                ghost[name] = {
                    "changed": True,
                    "error": str(record.get("error") or "")[:300] or None,
                    "aliases_previous": False,
                    "stubbed": int(record.get("stubbed") or 0),
                    "graph_replays": int(record.get("graph_replays") or 0),
                }
            self.arena.used = mark
            real, _, _ = self.check_case(ref_model, models[0], inputs)
        except checks.CheckFailure as exc:
            raise GradeFailure(Outcome.INCORRECT, f"audit probe, shape {shape}: {exc}") from None
        for name, out in outs.items():
            ghost[name]["changed"] = out is None or not checks.same_values(real, out)
        self.evidence["ghost"] = ghost

    def collect_evidence(self, timings: Sequence[Dict[str, Any]] = (), complete: bool = False) -> None:
        """The runner's own records: runtime events (beside those it streamed), torch ops over every call (from its
        dispatch-mode recorder and its profiler session, which also sees ops run with dispatch disabled), kernel
        launches, each counted call's work, and on GPUs each timed shape's profiled kernels. ``complete``: the
        grade ran every stage, so the records must cover every call this process made, and on a track of the
        candidate's own kernels, some of those calls must have launched them."""
        groups = {token: tag for token, (_, tag, _, _) in self.commands.items()}
        reply = self.ask("evidence", groups=groups, calls=self.calls_by_tag)
        self.stage = self.stage  # closes the clock of the stage it is in
        self.evidence["stages"] = self.stages
        ops, profiled = fields(reply.get("ops")), fields(reply.get("profiled"))
        self.runner_evidence(reply.get("evidence"))
        by_group = witness.grouped(
            reply.get("calls"), groups, {token: model for token, (_, _, _, model) in self.commands.items()}
        )
        probe = {
            "shape": self.req.shapes[0],
            "calls": self.work["calls"],
            "launches": counts(reply.get("launches")),
            "kernels": [str(k)[:200] for k in (reply.get("kernels") or [])][:100],
            "aten_ops": counts(ops.get("aten_ops")),
            "profiled_ops": counts(profiled.get("ops")),
            "comm_ops": counts(profiled.get("comm_ops")),  # torch.distributed's, per backend (the multi track's gate)
            "gpu_kernels": [str(k)[:200] for k in (profiled.get("kernels") or [])][:200],
            "own_ops": counts(ops.get("own_ops")),
            # the groups of calls this process counted: a capture that failed ran nothing, and its calls are no work
            "work": witness.call_work(
                {g: rows for g, rows in by_group.items() if self.calls_by_tag.get(g)},
                profiled.get("range_flops"),
                self.problem_work,
                profiled.get("range_bytes"),
            ),
            "ghost": self.evidence.pop("ghost", None),
        }
        if self.device.type == "cuda" and isinstance(reply.get("persisting_l2_limit"), int):
            probe["persisting_l2_limit"] = reply["persisting_l2_limit"]
        self.evidence["probe"] = probe
        if complete:
            self.judge_records(by_group, profiled, probe["work"])
        if complete and self.req.mode == "profile" and timings:  # the first timed shape's calls, for the agent
            group = f"{witness.TIMED}0"
            self.profile = profile_view(
                profiled, group, self.calls_by_tag.get(group, 0), by_group.get(group, []), self.device.type
            )
        number = lambda v: float(v) if isinstance(v, (int, float)) else 0.0  # noqa: E731
        profiles = fields(profiled.get("profiles"))
        for index, entry in enumerate(timings):
            found = profiles.get(f"/timing/{index}")
            if self.device.type == "cuda" and isinstance(found, dict):
                entry["profile"] = {
                    "launches_per_call": number(found.get("launches_per_call")),
                    "kernels": {str(k)[:200]: number(v) for k, v in list(fields(found.get("kernels")).items())[:200]},
                    "streams": [int(x) for x in found.get("streams") or [] if isinstance(x, int)],
                    "median_launches": number(found.get("median_launches")),
                }

    def runner_evidence(self, evidence: Any) -> None:
        """The runner's own records with only the shapes the audit reads; its runtime events join those it streamed
        (which it can no longer take back), each stage named here."""
        evidence = fields(evidence)
        events = self.evidence.setdefault("runtime_events", [])
        for event in (evidence.get("runtime_events") or [])[:MAX_EVENTS]:
            entry = self.event_entry(event)
            if entry is not None and entry not in events:
                events.append(entry)
        threads = [t for t in evidence.get("threads") or [] if isinstance(t, dict)][:MAX_EVENTS]
        flags = fields(evidence.get("global_flags"))
        text = lambda v: str(v)[:300]  # noqa: E731
        self.evidence["threads"] = [
            {
                "where": text(t.get("where")),
                "stage": self.stage_of(text(t.get("stage"))),
                "running": bool(t.get("running")),
                "outlived_call": bool(t.get("outlived_call")),
            }
            for t in threads
        ]
        self.evidence["global_flags"] = {
            text(k): [text(v[0]), text(v[-1])] for k, v in list(flags.items())[:20] if isinstance(v, list) and v
        }

    def problem_work(self, group: str) -> tuple:
        """(FLOPs, bytes) of one call of the shape a group's calls ran on."""
        from kbsweep.config.problems import evaluate

        shapes = {tag: shape for _, tag, shape, _ in self.commands.values() if shape is not None}
        shape = shapes.get(group) or shapes[group.removesuffix(profiling.CAPTURE_TAG)]
        return tuple(float(evaluate(self.spec.get(key), shape, key) or 0.0) for key in ("flops", "bytes"))

    def judge_records(self, by_group: Dict[str, Any], profiled: Dict[str, Any], work: Dict[str, Any]) -> None:
        """A grade that ran to its end: the runner's records against the calls made here (``evidence_mismatch``), and
        on a track of the candidate's own kernels, counted calls that launched none of them (``no_kernel``)."""
        counted = {tag: n for tag, n in self.calls_by_tag.items() if n}
        disagree = witness.mismatches(counted, by_group, profiled or None)
        if disagree:
            self.findings.append({"kind": "evidence_mismatch", "detail": "; ".join(disagree)[:500]})
        if self.req.own_kernels and work["basis"] != "none" and (not work["own_launches"] or work["idle_groups"]):
            where = (
                f"{work.get('idle_calls', 0)} calls of {', '.join(work['idle_groups'])}"
                if work["idle_groups"]
                else f"every {work['basis']} call"
            )
            self.findings.append({"kind": "no_kernel", "detail": f"no kernel of the candidate's own in {where}"})

    @staticmethod
    def deck_hashes(deck: Path) -> Dict[str, str]:
        """Each file of the deck by its hash: what the grade changed there is evidence."""
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(deck.iterdir()) if p.is_file()}
