"""The export stage: a folder ready to publish as a Hugging Face dataset, built from the tracking store.

``traces/<run_id>.jsonl`` holds each cell's transcript as a Claude Code session (the Hub's agent-trace viewer
format; ``kbsweep.agent.trace_export`` does the conversion), ``index.jsonl`` one row per cell run with its
scores, costs and verdict, ``solutions/<run_id>.py`` each cell's final solution, ``cells/<run_id>.json`` the
conditions it was graded under (deck version, shapes, timer version, versions of torch and Triton, card) and its
per-shape figures (what ``kbsweep verify`` re-derives), ``README.md`` the dataset card and ``MANIFEST.json`` the
SHA-256 of every other file. Everything written passes the transcript redactor again. No network.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from kbsweep.agent.trace_export import trace_jsonl
from kbsweep.agent.transcript import Redactor, read_events

INDEX_FIELDS = (
    "run_id",
    "experiment",
    "track",
    "problem",
    "gpu",
    "model",
    "harness",
    "provider",
    "repeat",
    "outcome",
    "outcome_class",
    "verdict",
    "score",
    "score_public",
    "score_held_out",
    "fraction_geomean",
    "speedup_eager",
    "speedup_compile",
    "speedup_sota",
    "tokens_input",
    "tokens_output",
    "tokens_cached",
    "tokens_reasoning",
    "cost_usd",
    "agent_s",
    "grade_s",
    "turns",
    "deck_version",
    "cell_key",
)
MANIFEST = "MANIFEST.json"
EXPORTED_DIRS = ("traces", "solutions", "cells")
CARD = """---
pretty_name: {title}
tags: [agent-traces, format:agent-traces, gpu-kernels, benchmark]
configs:
  - config_name: index
    default: true
    data_files: index.jsonl
  - config_name: traces
    data_files: "traces/*.jsonl"
---
# {title}

{runs} agent runs exported by kbsweep.

- `traces/<run_id>.jsonl`: one session per run in the Claude Code session schema (Hub agent-trace viewer).
- `solutions/<run_id>.py`: each run's final solution; `cells/<run_id>.json`: the conditions it was graded under
  and its per-shape figures; `MANIFEST.json`: the SHA-256 of every other file (`kbsweep verify` refuses a
  folder that does not match it).
- `index.jsonl`: one row per run with track, problem, GPU, model, harness (who drove the model: kbsweep's
  own loop, Claude Code, Codex), provider, repeat, outcome, audit verdict, score
  (roofline fraction geomean or speedup; over public and held-out shapes apart where both were graded), speedups, tokens, dollars and wall times.

Runs whose audit verdict is not `clean` are included with their verdict; they never rank on kbsweep boards.

`datasets.load_dataset(path)` loads the index (the default config). The traces config is what the Hub's trace
viewer reads; `datasets` decodes agent traces only with the package `teich` installed, and without it loads
their raw records with `load_dataset(path, "traces", parse_agent_traces=False)`.
"""


def index_row(row: Dict[str, Any]) -> Dict[str, Any]:
    return {field: row.get(field) for field in INDEX_FIELDS}


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_manifest(out: Path) -> Dict[str, str]:
    """``MANIFEST.json``: every file of the export but itself, by relative path, with its SHA-256."""
    files = {
        p.relative_to(out).as_posix(): sha256(p)
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name != MANIFEST and not p.relative_to(out).as_posix().startswith(".")
    }
    (out / MANIFEST).write_text(json.dumps({"algorithm": "sha256", "files": files}, indent=1) + "\n")
    return files


def cell_record(row: Dict[str, Any], grade: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The conditions a run was graded under and its per-shape figures, from its grade.json (the store's row else)."""
    from kbsweep.grader.baselines import card

    grade = grade or {}
    timings = grade.get("timings") or []
    timers = {
        str(((b or {}).get("conditions") or {}).get("timer"))
        for t in timings
        for b in (t.get("baselines") or {}).values()
        if (b or {}).get("conditions")
    }
    env = grade.get("env") or {}
    shapes = [
        {
            "shape": s.get("shape"),
            "ms": s.get("ms"),
            "fraction": s.get("fraction"),
            "held_out": bool(s.get("held_out")),
            "ci95_ms": ((timings[i].get("candidate") or {}).get("ci95_ms") if i < len(timings) else None),
        }
        for i, s in enumerate(grade.get("shapes") or [])
    ]
    return {
        "run_id": row["run_id"],
        "problem": row.get("problem"),
        "track": row.get("track"),
        "gpu": row.get("gpu"),
        "conditions": {
            "deck_version": grade.get("deck_version") or row.get("deck_version"),
            "shape_set": grade.get("shape_set"),
            "timer_version": timers.pop() if len(timers) == 1 else None,
            "card": card(env) if env else None,
            **{k: env.get(k) for k in ("torch", "triton", "cuda", "python")},
            "roofline": row["params"].get("roofline.name"),
            "problems_dir": row["params"].get("track.problems_dir"),
        },
        "outcome": grade.get("outcome", row.get("outcome")),
        "score": row.get("score"),
        "verdict": row.get("verdict"),
        "fraction_geomean": row.get("fraction_geomean"),
        "shapes": shapes,
    }


def export_dataset(uri: str, out: Path, experiments: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Write traces, solutions, cell records, the index and the manifest for every finished cell run of the store
    (or of the named experiments; latest run per cell key)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    from kbsweep.reporting.report import entrant
    from kbsweep.tracking.mlflow_store import latest_per_cell, runs_frame

    rows = latest_per_cell(runs_frame(uri, list(experiments) if experiments else None))
    out = Path(out)
    for name in EXPORTED_DIRS:
        if (out / name).exists():
            shutil.rmtree(out / name)
        (out / name).mkdir(parents=True)
    redactor = Redactor()
    index: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for row in rows:
            entry = {**index_row(row), "trace": None, "solution": None, "record": None}
            artifacts = get_artifact_repository(
                row["artifact_uri"], tracking_uri=uri
            )  # the client's would read each run again
            stored = {f.path for f in artifacts.list_artifacts()}
            here = Path(scratch) / row["run_id"]
            here.mkdir()
            if "transcript.jsonl" in stored:
                local = artifacts.download_artifacts("transcript.jsonl", str(here))
                title = f"{entrant(row)} · {row.get('problem')} · {row.get('gpu')} · r{row.get('repeat')}"
                model = row["params"].get("model.route") or str(row.get("model"))
                text = trace_jsonl(read_events(Path(local)), row["run_id"], title, model)
                (out / "traces" / f"{row['run_id']}.jsonl").write_text(redactor.text(text))
                entry["trace"] = f"traces/{row['run_id']}.jsonl"
            if "solution.py" in stored:
                source = Path(artifacts.download_artifacts("solution.py", str(here))).read_text()
                (out / "solutions" / f"{row['run_id']}.py").write_text(redactor.text(source))
                entry["solution"] = f"solutions/{row['run_id']}.py"
            grade = (
                json.loads(Path(artifacts.download_artifacts("grade.json", str(here))).read_text())
                if "grade.json" in stored
                else None
            )
            (out / "cells" / f"{row['run_id']}.json").write_text(
                redactor.text(json.dumps(cell_record(row, grade), indent=1, default=str))
            )
            entry["record"] = f"cells/{row['run_id']}.json"
            index.append(entry)
    (out / "index.jsonl").write_text(redactor.text("".join(json.dumps(r, default=str) + "\n" for r in index)))
    (out / "README.md").write_text(CARD.format(title="kbsweep agent traces", runs=len(index)))
    write_manifest(out)
    return {"runs": len(index), "traces": sum(1 for r in index if r.get("trace")), "out": str(out)}
