"""Audits of stored runs: re-audit cells from their MLflow artifacts, and record a human's override.

Tags written on a cell run: ``audit.verdict`` (the audit's own), ``audit.<layer>`` (each layer's verdict),
``audit.kinds`` (the kinds behind the verdict) and ``verdict`` (what the board ranks; an override's verdict once a
human has spoken: ``override_clean`` when cleared). Artifacts: ``audit.json`` and ``audit_override.json``.
"""

from __future__ import annotations

import getpass
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from kbsweep.agent.models import ChatModel
from kbsweep.audit import audit
from kbsweep.config.problem_folders import find_problem_dir
from kbsweep.config.problems import load_problem
from kbsweep.errors import KbsweepError
from kbsweep.outcomes import Verdict
from kbsweep.tracking.mlflow_store import latest_per_cell, make_client, runs_frame

OVERRIDE_CLEAN = "override_clean"  # the board's spelling of a verdict a human cleared
OVERRIDE_TAG = "audit.override.verdict"
STORED = ("solution.py", "grade.json", "transcript.jsonl")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def log_tags(client, run_id: str, tags: Dict[str, str]) -> None:
    from mlflow.entities import RunTag

    client.log_batch(run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in sorted(tags.items())])


def download(client, run_id: str, folder: Path) -> Dict[str, Path]:
    """The run's stored solution, grade and transcript that exist, by name."""
    present = {a.path for a in client.list_artifacts(run_id)}
    return {name: Path(client.download_artifacts(run_id, name, str(folder))) for name in STORED if name in present}


def problem_of(row: Dict[str, Any], roots: List[str]):
    params = row.get("params") or {}
    track, _, name = row["problem"].partition("/")
    folder = find_problem_dir(
        roots,
        params.get("track.problems_dir", track),
        name,
        params.get("track.format", "kbsweep"),
        params.get("track.kernelbench_version"),
    )
    return load_problem(folder, track)


def reaudit(
    uri: str, experiment: Optional[str], run_ids: List[str], roots: List[str], judge: Optional[ChatModel]
) -> List[Dict[str, Any]]:
    """Audit again the named runs (or the latest run of every cell of ``experiment``) and record the results."""
    client = make_client(uri)
    rows = runs_frame(uri, [experiment] if experiment and not run_ids else None)
    rows = [r for r in rows if r["run_id"] in run_ids] if run_ids else latest_per_cell(rows)
    missing = set(run_ids) - {r["run_id"] for r in rows}
    if missing:
        raise KbsweepError(f"no cell run {', '.join(sorted(missing))} in {uri}")
    done = []
    for row in rows:
        with tempfile.TemporaryDirectory() as tmp:
            files = download(client, row["run_id"], Path(tmp))
            if "solution.py" not in files:
                continue  # nothing was submitted: nothing to audit
            problem = problem_of(row, roots)
            grade = json.loads(files["grade.json"].read_text()) if "grade.json" in files else None
            result = audit(
                files["solution.py"].read_text(),
                problem.spec.forbidden,
                grade,
                problem=problem,
                transcript=files.get("transcript.jsonl"),
                judge=judge,
            )
        done.append(record(client, row, result))
    return done


def record(client, row: Dict[str, Any], result: Dict[str, Any]) -> Dict[str, Any]:
    """Write an audit's tags and audit.json; the board's ``verdict`` follows unless a human overrode it."""
    kinds = sorted({f["kind"] for f in result["findings"] if f["verdict"]})
    tags = {"audit.verdict": result["verdict"], "audit.kinds": ",".join(kinds), "audit.at": now()}
    tags.update({f"audit.{layer}": info["verdict"] for layer, info in result["layers"].items()})
    if OVERRIDE_TAG not in row:
        tags["verdict"] = result["verdict"]
    log_tags(client, row["run_id"], tags)
    client.log_text(row["run_id"], json.dumps(result, indent=1, default=str), "audit.json")
    return {
        "run_id": row["run_id"],
        "problem": row.get("problem"),
        "model": row.get("model"),
        "previous": row.get("verdict"),
        "verdict": result["verdict"],
        "board": tags.get("verdict", row.get("verdict")),
        "kinds": kinds,
    }


def override(uri: str, run_id: str, verdict: str, reason: str) -> Dict[str, Any]:
    """A human's verdict on a run, with its reason, recorded (tags and audit_override.json); a cleared run ranks
    as ``override_clean``."""
    if verdict not in {v.value for v in Verdict}:
        raise KbsweepError(f"--verdict must be one of {', '.join(v.value for v in Verdict)}")
    if not reason.strip():
        raise KbsweepError("--reason is required")
    from mlflow.exceptions import MlflowException

    client = make_client(uri)
    try:
        previous = client.get_run(run_id).data.tags.get("verdict")
    except MlflowException:
        raise KbsweepError(f"no run {run_id} in {uri}") from None
    entry = {
        "run_id": run_id,
        "verdict": verdict,
        "reason": reason,
        "by": getpass.getuser(),
        "at": now(),
        "previous": previous,
    }
    board = OVERRIDE_CLEAN if verdict == Verdict.CLEAN.value else verdict
    log_tags(
        client,
        run_id,
        {
            "verdict": board,
            OVERRIDE_TAG: verdict,
            "audit.override.reason": reason,
            "audit.override.by": entry["by"],
            "audit.override.at": entry["at"],
            "audit.override.previous": str(previous),
        },
    )
    client.log_text(run_id, json.dumps(entry, indent=1), "audit_override.json")
    return {**entry, "board": board}
