"""The export stage: a folder ready to publish as a Hugging Face dataset, built from the tracking store.

``traces/<run_id>.jsonl`` holds each cell's transcript as a Claude Code session (the Hub's agent-trace viewer
format; ``kbsweep.agent.trace_export`` does the conversion), ``index.jsonl`` one row per cell run with its
scores, costs and verdict, ``README.md`` the dataset card. Everything written passes the transcript
redactor again. No network.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List

from kbsweep.agent.trace_export import trace_jsonl
from kbsweep.agent.transcript import Redactor, read_events

INDEX_FIELDS = (
    "run_id", "experiment", "track", "problem", "gpu", "model", "harness", "provider", "repeat", "outcome", "outcome_class", "verdict",
    "score", "score_public", "score_held_out", "fraction_geomean", "speedup_eager", "speedup_compile", "speedup_sota", "tokens_input", "tokens_output",
    "tokens_cached", "tokens_reasoning", "cost_usd", "agent_s", "grade_s", "turns", "deck_version", "cell_key",
)
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


def export_dataset(uri: str, out: Path) -> Dict[str, Any]:
    """Write traces and the index for every finished cell run of the store (latest run per cell key)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    from kbsweep.reporting.report import entrant
    from kbsweep.tracking.mlflow_store import latest_per_cell, runs_frame

    rows = latest_per_cell(runs_frame(uri))
    out = Path(out)
    if (out / "traces").exists():
        shutil.rmtree(out / "traces")
    (out / "traces").mkdir(parents=True)
    redactor = Redactor()
    index: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for row in rows:
            entry = {**index_row(row), "trace": None}
            artifacts = get_artifact_repository(row["artifact_uri"], tracking_uri=uri)  # the client's would read each run again
            if "transcript.jsonl" in {f.path for f in artifacts.list_artifacts()}:
                local = artifacts.download_artifacts("transcript.jsonl", scratch)
                title = f"{entrant(row)} · {row.get('problem')} · {row.get('gpu')} · r{row.get('repeat')}"
                model = row["params"].get("model.route") or str(row.get("model"))
                text = trace_jsonl(read_events(Path(local)), row["run_id"], title, model)
                (out / "traces" / f"{row['run_id']}.jsonl").write_text(redactor.text(text))
                entry["trace"] = f"traces/{row['run_id']}.jsonl"
            index.append(entry)
    (out / "index.jsonl").write_text(redactor.text("".join(json.dumps(r, default=str) + "\n" for r in index)))
    (out / "README.md").write_text(CARD.format(title="kbsweep agent traces", runs=len(index)))
    return {"runs": len(index), "traces": sum(1 for r in index if r.get("trace")), "out": str(out)}
