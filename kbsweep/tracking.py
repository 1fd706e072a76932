"""The tracking stage: MLflow holds every sweep (parent run) and cell (child run) with its evidence.

Only the orchestrator writes here (one writer per store); cells write ``result.json`` journals that are
logged when they come back, so a killed sweep loses no finished cell.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from kbsweep.matrix import Cell
from kbsweep.outcomes import Outcome

ARTIFACTS = ("solution.py", "transcript.jsonl", "grade.json", "audit.json", "result.json")
CELL_KEY_TAG = "kbsweep.cell_key"


def flatten(prefix: str, value: Any, out: Dict[str, str]) -> Dict[str, str]:
    if isinstance(value, dict):
        for key, sub in value.items():
            flatten(f"{prefix}.{key}" if prefix else str(key), sub, out)
    elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        out[prefix] = json.dumps(value, default=str)[:5000]
    else:
        out[prefix] = str(value)[:5000]
    return out


def cell_metrics(result: Dict[str, Any]) -> Dict[str, float]:
    metrics: Dict[str, float] = {}
    for i, shape in enumerate(result.get("shapes") or []):
        for key in ("ms", "tflops", "gbps", "fraction"):
            if shape.get(key) is not None:
                metrics[f"shape{i}.{key}"] = shape[key]
        for name, value in (shape.get("speedup") or {}).items():
            metrics[f"shape{i}.speedup_{name}"] = value
    for name, value in (result.get("speedup") or {}).items():
        if value is not None:
            metrics[f"speedup_{name}"] = value
    if result.get("score") is not None:
        metrics["score"] = result["score"]
    metrics["passed"] = 1.0 if result.get("outcome") == Outcome.PASS.value else 0.0
    for key, value in (result.get("usage") or {}).items():
        metrics[f"tokens_{key.replace('_tokens', '')}"] = value
    for key in ("cost_usd", "agent_s", "grade_s", "turns"):
        if result.get(key) is not None:
            metrics[key] = result[key]
    return metrics


class Tracker:
    """An MLflow experiment per sweep name; a parent run per invocation; a child run per cell."""

    def __init__(self, uri: str, artifact_root: str, sweep: str):
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        from mlflow.tracking import MlflowClient

        if uri.startswith("sqlite:///"):
            Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(sweep)
        if experiment is None:
            location = Path(artifact_root).resolve().as_uri() + f"/{sweep}" if artifact_root else None
            self.experiment_id = self.client.create_experiment(sweep, artifact_location=location)
        else:
            self.experiment_id = experiment.experiment_id
        self.parent_id: Optional[str] = None

    def start_sweep(self, params: Dict[str, Any], cells: int) -> str:
        run = self.client.create_run(self.experiment_id, tags={"kbsweep.kind": "sweep"}, run_name=time.strftime("sweep-%Y%m%d-%H%M%S"))
        self.parent_id = run.info.run_id
        self.client.log_param(self.parent_id, "cells", cells)
        for key, value in params.items():
            self.client.log_param(self.parent_id, key, value)
        return self.parent_id

    def end_sweep(self, status: str = "FINISHED") -> None:
        if self.parent_id:
            self.client.set_terminated(self.parent_id, status)

    def cell_runs(self) -> List[Any]:
        return self.client.search_runs([self.experiment_id], filter_string="tags.`kbsweep.kind` = 'cell'", max_results=50_000)

    def finished_keys(self) -> Dict[str, str]:
        """Cell keys with a finished, non-infra record (these are never run again without --force)."""
        done = {}
        for run in self.cell_runs():
            outcome = run.data.tags.get("outcome")
            if run.info.status == "FINISHED" and outcome and not Outcome(outcome).is_infra:
                done[run.data.tags[CELL_KEY_TAG]] = run.info.run_id
        return done

    def close_stale(self) -> int:
        """Mark runs left RUNNING by a killed sweep as KILLED; returns how many."""
        stale = [r for r in self.cell_runs() if r.info.status == "RUNNING"]
        for run in stale:
            self.client.set_terminated(run.info.run_id, "KILLED")
        return len(stale)

    def start_cell(self, cell: Cell) -> str:
        tags = {
            "kbsweep.kind": "cell",
            CELL_KEY_TAG: cell.key,
            "track": cell.track["name"],
            "problem": cell.problem,
            "gpu": cell.gpu["name"],
            "model": cell.model["name"],
            "repeat": str(cell.repeat),
            "deck_version": cell.deck_version,
        }
        if self.parent_id:
            tags["mlflow.parentRunId"] = self.parent_id
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=cell.label.replace(" · ", "_"))
        params = flatten("", {"model": cell.model, "gpu": cell.gpu, "track": cell.track, "grade": cell.grade}, {})
        params.update({"problem": cell.problem, "repeat": str(cell.repeat), "deck_version": cell.deck_version})
        self.log_params(run.info.run_id, params)
        return run.info.run_id

    def log_params(self, run_id: str, params: Dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(params.items())]
        for start in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[start : start + 100])

    def finish_cell(self, run_id: str, result: Dict[str, Any]) -> None:
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, 0) for k, v in cell_metrics(result).items()]
        for step in result.get("steps") or []:
            if step.get("best_score") is not None:
                metrics.append(Metric("best_score", step["best_score"], now, step["turn"]))
        tags = [RunTag("outcome", result["outcome"]), RunTag("verdict", str(result.get("verdict")))]
        tags.append(RunTag("stop_reason", str(result.get("stop_reason"))))
        if result.get("message"):
            tags.append(RunTag("message", str(result["message"])[:4000]))
        env = result.get("env") or {}
        for key in ("torch", "triton", "python", "host"):
            if key in env:
                tags.append(RunTag(f"env.{key}", str(env[key])))
        for i, gpu in enumerate(env.get("gpus") or []):
            tags.append(RunTag(f"env.gpu{i}", f"{gpu.get('name')} {gpu.get('uuid')} driver {gpu.get('driver')}"))
        self.client.log_batch(run_id, metrics=metrics, tags=tags)
        folder = Path(result.get("folder", ""))
        for name in ARTIFACTS:
            if (folder / name).exists():
                self.client.log_artifact(run_id, str(folder / name))
        status = "FAILED" if Outcome(result["outcome"]).is_infra else "FINISHED"
        self.client.set_terminated(run_id, status)


def runs_frame(uri: str, experiments: Optional[Iterable[str]] = None) -> List[Dict[str, Any]]:
    """Every cell run of the store (or of the named experiments) as plain rows, for reports."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    names = set(experiments or [])
    ids = [e.experiment_id for e in client.search_experiments() if not names or e.name in names]
    if not ids:
        return []
    rows = []
    for run in client.search_runs(ids, filter_string="tags.`kbsweep.kind` = 'cell'", max_results=50_000):
        rows.append({"run_id": run.info.run_id, "status": run.info.status, **run.data.tags, **run.data.metrics})
    return rows
