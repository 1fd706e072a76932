"""The audit stage: findings and one verdict per cell, in three layers (see docs/audit.md).

1. :mod:`~kbsweep.audit.static`: the candidate's AST, names resolved, checked against the problem's forbidden
   names and the rule set (fallbacks, caches, sniffing, patching, threads, files, flags, precision, other runs).
2. :mod:`~kbsweep.audit.dynamic`: the grader's own evidence (ghost replays, the aten trace of a probe call,
   runtime events, threads, flags, file hashes, timer gaps, profiled kernels), recorded by
   :mod:`~kbsweep.grader.runner.runtime` inside the grading process; plus the transcript's reaches into other runs.
3. :mod:`~kbsweep.audit.judge`: an LLM over the solution, the findings, the evidence and transcript excerpts.

Each finding implies a verdict (:data:`~kbsweep.audit.kinds.KINDS`); the cell's verdict is the most severe.
Also the audit cases (:mod:`~kbsweep.audit.cases`) and re-audits of stored runs (:mod:`~kbsweep.audit.store`).

Rank 9 of the layout (docs/architecture.md; the ranks live in tests/test_layout.py): imports tracking and the
stages below it. What the grader installs in the candidate's process (monitor, gate, seals) is
:mod:`kbsweep.grader.runner`, not here.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional

from kbsweep.agent.models import ChatModel
from kbsweep.audit import contamination, dynamic, static
from kbsweep.audit import judge as judge_layer
from kbsweep.audit import transcript as transcript_layer
from kbsweep.audit.kinds import unique, verdict_of
from kbsweep.audit.static_rules import Forbidden


def workspace_helpers(folder: Path, reference: Optional[str] = None) -> Dict[str, str]:
    """The Python files the grader stages beside solution.py (a reference.py identical to the deck's is left out)."""
    files = {
        p.name: p.read_text(errors="replace") for p in sorted(Path(folder).glob("*.py")) if p.name != "solution.py"
    }
    if files.get("reference.py") == reference:
        files.pop("reference.py")
    return files


EVIDENCE_KEYS = (
    "probe",
    "runtime_events",
    "threads",
    "global_flags",
    "files_modified",
    "poison_deterministic",
    "pointer_cache_probe",
)


def audit(
    source: str,
    forbidden: List[str],
    grade: Optional[Dict[str, Any]],
    *,
    problem: Any = None,
    transcript: Any = None,
    judge: Optional[ChatModel] = None,
    helpers: Optional[Dict[str, str]] = None,
    judge_deadline: Optional[float] = None,
) -> Dict[str, Any]:
    """``{"verdict", "findings", "layers"}`` for one solution.

    ``grade``: the grader's result (its evidence feeds the dynamic layer); ``problem``: the Problem (precision and
    reference for the static layer); ``transcript``: transcript.jsonl path or events; ``judge``: the judge model,
    or None to skip the LLM layer (its failures are ``judge_error`` findings, never exceptions; ``layers.judge``
    records its model, answer, attempts, tokens and cost); ``helpers``: the workspace's other Python files
    (name -> source), which the grader stages beside solution.py; ``judge_deadline``: a ``time.monotonic()``
    instant the judge's calls should not run past.
    """
    spec = problem.spec if problem is not None else None
    reference = problem.reference.read_text() if problem is not None else None
    events = transcript_layer.load(transcript)
    layers: Dict[str, Dict[str, Any]] = {}
    files = {"solution.py": source, **(helpers or {})}
    precision = spec.precision if spec else None
    kernels = [k for text in files.values() for k in static.kernel_names(text)]
    own = {Path(name).stem for name in files if name != "solution.py"}
    compute = not (spec and spec.constraints.get("collective"))  # collective problems score the communication
    found = {
        "static": [
            replace(f, where={**f.where, "file": name})
            for name, text in files.items()
            for f in static.analyze(text, forbidden, precision, reference, own, compute)
        ],
        "dynamic": dynamic.findings(grade, Forbidden(forbidden), kernels, compute) if grade else [],
        "contamination": contamination.findings(transcript, files),
    }
    if judge is not None:
        context = {
            "problem": getattr(problem, "id", None),
            "precision": spec and spec.precision,
            "forbidden": forbidden,
            "outcome": (grade or {}).get("outcome"),
            "score": (grade or {}).get("score"),
        }
        evidence = {k: v for k, v in ((grade or {}).get("evidence") or {}).items() if k in EVIDENCE_KEYS}
        prior = unique(found["static"] + found["dynamic"] + found["contamination"])
        found["judge"], layers["judge"] = judge_layer.run(
            judge, context, files, prior, evidence, transcript_layer.excerpt(events), judge_deadline
        )
    for name, items in found.items():
        layers.setdefault(name, {}).update(verdict=verdict_of(items).value, findings=len(items))
    findings = unique(f for items in found.values() for f in items)
    return {"verdict": verdict_of(findings).value, "findings": [f.to_json() for f in findings], "layers": layers}
