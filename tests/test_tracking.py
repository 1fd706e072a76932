"""What one cell run holds in MLflow (sqlite store): params, metrics, step metrics, tags, artifacts; stale runs.

``make_cell`` and ``write_result`` are shared with the resume and report tests: real cells of demo/scale_shift
composed by Hydra, and results shaped like ``cell.run_cell``'s, written to disk without running an agent.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

import kbsweep.compose  # noqa: F401  (registers the config resolvers)
from kbsweep.planner.matrix import Cell, cell_dir
from kbsweep.score.roofline import geomean
from kbsweep.tracking import tracker as tracking
from kbsweep.tracking.cell_result import CellResult
from kbsweep.tracking.tracker import BATCH, Tracker, cell_metrics, outcome_class

REPO = Path(__file__).resolve().parent.parent
STEPS = [
    {"turn": 2, "tokens": 1000, "usd": 0.01, "best_score": None},
    {"turn": 4, "tokens": 3000, "usd": 0.03, "best_score": 0.2},
    {"turn": 6, "tokens": 5000, "usd": 0.05, "best_score": 0.45},
]
EVENTS = [
    {"ts": 1_796_000_000.0, "type": "system", "content": "system prompt"},
    {"ts": 1_796_000_001.0, "type": "user", "content": "make it fast"},
    {
        "ts": 1_796_000_002.0,
        "type": "assistant",
        "content": "ok",
        "tool_calls": [],
        "usage": {"input_tokens": 10, "output_tokens": 2},
        "finish_reason": "stop",
    },
    {"ts": 1_796_000_003.0, "type": "stop", "reason": "model_stopped", "turns": 1, "cost_usd": 0.05},
]


def make_cell(
    outputs: Path, repeat: int = 0, model: str = "scripted", problem: str = "scale_shift", sweep: str = "demo"
) -> Cell:
    """A real cell (Hydra-composed, schema-validated) writing under ``outputs``."""
    from hydra import compose, initialize_config_dir

    from kbsweep.config.schema import validate
    from kbsweep.planner.matrix import cells_of

    overrides = [
        "gpu=cpu",
        "launcher=inline",
        f"model={model}",
        f"problem={problem}",
        f"repeat={repeat}",
        f"paths.outputs={outputs}",
        f"sweep.name={sweep}",
    ]
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose(config_name="config", overrides=overrides)
    [cell] = cells_of(validate(cfg))
    return cell


def write_result(
    cell: Cell, outcome: str = "pass", score: float = 0.4, verdict: str = "clean", **extra: Any
) -> Dict[str, Any]:
    """A result.json (and the files a finished cell leaves) in the cell's folder, as cell.run_cell writes them."""
    folder = cell_dir(cell)
    folder.mkdir(parents=True, exist_ok=True)
    shapes = [
        {
            "shape": {"rows": 64, "cols": 96},
            "ms": 2.0,
            "tflops": 6e-6,
            "gbps": 0.025,
            "fraction": score,
            "speedup": {"eager": 1.5},
        },
        {
            "shape": {"rows": 33, "cols": 70},
            "ms": 1.0,
            "tflops": 4e-6,
            "gbps": 0.018,
            "fraction": score,
            "speedup": {"eager": 2.0},
            "baselines_outside_tolerance": ["sota"],
        },
    ]
    result = {
        "outcome": outcome,
        "score": score if outcome == "pass" else None,
        "basis": "roofline",
        "speedup": {"eager": 1.7, "compile": 1.2, "sota": 0.9},
        "shapes": shapes,
        "verdict": verdict,
        "stop_reason": "submitted",
        "turns": 6,
        "usage": {
            "input_tokens": 4000,
            "output_tokens": 1000,
            "cached_tokens": 500,
            "cache_write_tokens": 0,
            "reasoning_tokens": 200,
        },
        "cost_usd": 0.05,
        "agent_s": 12.5,
        "grade_s": 3.5,
        "steps": STEPS,
        "env": {
            "python": "3.11.7",
            "torch": "2.13.0+cpu",
            "triton": "3.7.1",
            "host": "vm",
            "gpus": [{"name": "NVIDIA H200", "uuid": "GPU-abc", "driver": "580.1"}],
        },
        "key": cell.key,
        "cell": cell.label,
        "started": 1_796_000_000.0,
        "finished": 1_796_000_020.0,
        "folder": str(folder),
        **extra,
    }
    (folder / "solution.py").write_text("class ModelNew: pass\n")
    (folder / "transcript.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    (folder / "grade.json").write_text(json.dumps({"outcome": outcome}))
    (folder / "audit.json").write_text(json.dumps({"verdict": verdict, "findings": []}))
    (folder / "result.json").write_text(json.dumps(result))
    return result


def log_cell(tracker: Tracker, cell: Cell, **result_fields: Any) -> str:
    run_id = tracker.start_cell(cell)
    return tracker.finish_cell(run_id, CellResult.from_json(write_result(cell, **result_fields)))


def artifact_paths(client, run_id: str, path: str | None = None) -> set:
    found = set()
    for info in client.list_artifacts(run_id, path):
        found |= artifact_paths(client, run_id, info.path) if info.is_dir else {info.path}
    return found


def test_cell_run_holds_config_metrics_steps_tags_and_artifacts(store):
    outputs, uri = store
    cell = make_cell(outputs)
    tracker = Tracker(uri, str(outputs / "mlartifacts"), "demo")
    parent = tracker.start_sweep({"launcher": "inline"}, 1)
    run_id = log_cell(tracker, cell)
    client = tracker.client
    run = client.get_run(run_id)
    params, metrics, tags = run.data.params, run.data.metrics, run.data.tags

    assert run.info.status == "FINISHED" and tags["mlflow.parentRunId"] == parent
    assert client.get_experiment(tracker.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    # the whole resolved config as an artifact; the config keys the boards and the audit read as params, beside the
    # grading process's versions and GPU identity
    config = json.loads(Path(client.download_artifacts(run_id, "config.json", str(outputs / "config"))).read_text())
    assert (
        config["model"]["name"] == "scripted"
        and config["gpu"]["roofline"] == "cpu"
        and config["track"]["name"] == "demo"
    )
    assert config["grade"]["timing"]["min_runs"] == cell.grade["timing"]["min_runs"] and config["paths"] == cell.paths
    assert (config["deck_version"], config["repeat"], config["problem"], config["judge"]) == (
        cell.deck_version,
        0,
        "demo/scale_shift",
        cell.judge,
    )
    assert (
        params["track.problems_dir"] == "demo"
        and params["track.format"] == "kbsweep"
        and params["env.torch"] == "2.13.0+cpu"
    )
    # the orchestrator's versions are the sweep run's; a cell's params and the result's go in one request of MLflow's
    sweep_params = client.get_run(parent).data.params
    assert sweep_params["version.mlflow"] and sweep_params["version.kbsweep"] and len(params) <= BATCH["params"]
    assert params["env.gpu0.name"] == "NVIDIA H200" and params["env.gpu0.uuid"] == "GPU-abc"
    assert (
        params["roofline.dram_gbps"] == "20"
        and params["problem.peak"] == "fp32"
        and params["shape0"] == "rows=64, cols=96"
    )
    # per-shape, summary, tokens, dollars, times
    assert metrics["shape0.ms"] == 2.0 and metrics["shape1.tflops"] == 4e-6 and metrics["shape0.gbps"] == 0.025
    assert metrics["shape1.fraction"] == 0.4 and metrics["shape0.speedup_eager"] == 1.5
    assert metrics["fraction_geomean"] == pytest.approx(0.4) and metrics["score"] == 0.4
    assert (metrics["speedup_eager"], metrics["speedup_compile"], metrics["speedup_sota"]) == (1.7, 1.2, 0.9)
    assert tags["baselines_outside_tolerance"] == "sota"  # said beside the speedup it qualifies
    assert (
        metrics["tokens_input"],
        metrics["tokens_output"],
        metrics["tokens_cached"],
        metrics["tokens_reasoning"],
    ) == (4000, 1000, 500, 200)
    assert (metrics["cost_usd"], metrics["agent_s"], metrics["grade_s"], metrics["turns"], metrics["wall_s"]) == (
        0.05,
        12.5,
        3.5,
        6,
        20,
    )
    # the loop's best score so far against turn, tokens and micro-dollars
    history = {
        key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        for key in ("loop.best_score", "loop.best_score_by_tokens", "loop.best_score_by_microusd", "loop.tokens")
    }
    assert history["loop.best_score"] == [(4, 0.2), (6, 0.45)]
    assert history["loop.best_score_by_tokens"] == [(3000, 0.2), (5000, 0.45)]
    assert history["loop.best_score_by_microusd"] == [(30000, 0.2), (50000, 0.45)]
    assert [s for s, _ in history["loop.tokens"]] == [2, 4, 6]
    # labels
    assert {
        k: tags[k] for k in ("track", "problem", "gpu", "model", "repeat", "outcome", "outcome_class", "verdict")
    } == {
        "track": "demo",
        "problem": "demo/scale_shift",
        "gpu": "cpu",
        "model": "scripted",
        "repeat": "0",
        "outcome": "pass",
        "outcome_class": "pass",
        "verdict": "clean",
    }
    # evidence
    assert artifact_paths(client, run_id) == {
        "solution.py",
        "transcript.jsonl",
        "trace.jsonl",
        "grade.json",
        "audit.json",
        "result.json",
        "config.json",
    }  # no per-cell plots: the loop's progress is the metrics above, the shapes' roofline the report's
    trace = [
        json.loads(line)
        for line in Path(client.download_artifacts(run_id, "trace.jsonl", str(outputs))).read_text().splitlines()
    ]
    assert trace[0]["type"] == "custom-title" and [r["type"] for r in trace[3:]] == ["user", "assistant", "system"]


def test_infra_result_fails_the_run_and_is_not_finished(store):
    outputs, uri = store
    tracker = Tracker(uri, str(outputs / "mlartifacts"), "demo")
    good, infra = make_cell(outputs, repeat=0), make_cell(outputs, repeat=1)
    log_cell(tracker, good)
    run_id = log_cell(tracker, infra, outcome="rate_limited", score=0.0)
    run = tracker.client.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["outcome_class"] == "infra" and "score" not in run.data.metrics
    finished, logged = tracker.history()
    assert set(finished) == {good.key} and len(logged) == 2


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_close_stale_closes_only_runs_of_dead_orchestrators_of_this_host(store, monkeypatch):
    outputs, uri = store
    tracker = Tracker(uri, str(outputs / "mlartifacts"), "demo")
    owners = {
        "dead": f"{socket.gethostname()}:{dead_pid()}",
        "alive": f"{socket.gethostname()}:{os.getpid()}",
        "remote": "elsewhere:1",
    }
    runs = {}
    for name, owner in owners.items():
        monkeypatch.setattr(tracking, "owner", lambda owner=owner: owner)
        runs[name] = tracker.start_cell(make_cell(outputs, repeat=len(runs)))
    assert tracker.close_stale() == 1
    status = {name: tracker.client.get_run(run_id).info.status for name, run_id in runs.items()}
    assert status == {"dead": "KILLED", "alive": "RUNNING", "remote": "RUNNING"}


def test_batches_stay_within_mlflow_limits(store):
    outputs, uri = store
    tracker = Tracker(uri, str(outputs / "mlartifacts"), "demo")
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    params = {f"p{i}": str(i) for i in range(250)}  # MLflow refuses more than 100 per request
    tags = {f"t{i}": str(i) for i in range(250)}  # and more than 1000 entities of all kinds in one
    tracker.log_batch(run_id, params=params, tags=tags, metrics=[("m", float(i), i) for i in range(2500)])
    data = tracker.client.get_run(run_id).data
    assert len(data.params) == 250 and sum(k.startswith("t") for k in data.tags) == 250
    assert len(tracker.client.get_metric_history(run_id, "m")) == 2500


@pytest.mark.fast
def test_outcome_classes_and_metrics_of_a_failure():
    assert [outcome_class(o) for o in ("pass", "incorrect", "budget_exhausted", "node_failure", "disqualified")] == [
        "pass",
        "fail",
        "fail",
        "infra",
        "audit",
    ]
    metrics = cell_metrics(
        {"outcome": "incorrect", "shapes": [{"fraction": 0.5}, {"fraction": None}], "usage": {"output_tokens": 7}}
    )
    assert metrics == {"shape0.fraction": 0.5, "passed": 0.0, "tokens_output": 7.0}  # no geomean over a missing shape
    assert cell_metrics({"outcome": "pass", "shapes": [{"fraction": 0.1}, {"fraction": 0.4}]})[
        "fraction_geomean"
    ] == pytest.approx(geomean([0.1, 0.4]))


@pytest.mark.fast
def test_artifact_location_of_a_new_experiment(tmp_path):
    assert tracking.artifact_location("sqlite:///x.db", str(tmp_path), "s") == f"{tmp_path.as_uri()}/s"
    assert tracking.artifact_location("http://127.0.0.1:5000", str(tmp_path), "s") is None  # the server's proxied store
    assert tracking.artifact_location("http://127.0.0.1:5000", "s3://bucket/kb/", "s") == "s3://bucket/kb/s"
    assert tracking.artifact_location("sqlite:///x.db", "", "s") is None


@pytest.mark.parametrize("trace_spans", ["artifact", "store"])
def test_transcript_is_a_trace_of_the_cell_run_with_model_and_tool_spans(store, trace_spans):
    outputs, uri = store
    cell = make_cell(outputs)
    tracker = Tracker(uri, str(outputs / "mlartifacts"), "demo", trace_spans)
    tracker.start_sweep({"launcher": "inline"}, 1)
    run_id = tracker.start_cell(cell)
    result = write_result(cell)
    call = {"id": "c1", "type": "function", "function": {"name": "run_check", "arguments": '{"path": "solution.py"}'}}
    events = [
        *EVENTS[:2],
        {
            "ts": 1_796_000_001.5,
            "type": "retry",
            "attempt": 1,
            "error": "RateLimitError",
            "status": 429,
            "message": "slow down",
            "delay_s": 0.5,
        },
        {
            "ts": 1_796_000_004.0,
            "type": "assistant",
            "content": "checking",
            "tool_calls": [call],
            "latency_s": 2.0,
            "finish_reason": "tool_calls",
            "usage": {"input_tokens": 100, "output_tokens": 20, "cached_tokens": 60},
            "cost_usd": 0.25,
        },
        {
            "ts": 1_796_000_006.0,
            "type": "tool",
            "name": "run_check",
            "tool_call_id": "c1",
            "arguments": call["function"]["arguments"],
            "content": "PASS 3/3",
        },
        {
            "ts": 1_796_000_007.0,
            "type": "assistant",
            "content": "done",
            "tool_calls": [],
            "latency_s": 1.0,
            "finish_reason": "stop",
            "usage": {"input_tokens": 130, "output_tokens": 5},
            "cost_usd": 0.5,
        },
        {"ts": 1_796_000_008.0, "type": "stop", "reason": "model_stopped", "turns": 2, "cost_usd": 0.75},
    ]
    (Path(result["folder"]) / "transcript.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    tracker.finish_cell(run_id, CellResult.from_json(result))

    [trace] = tracker.client.search_traces(locations=[tracker.experiment_id], run_id=run_id)
    assert trace.info.request_metadata["mlflow.sourceRun"] == run_id and trace.info.tags["kbsweep.cell_key"] == cell.key
    in_store = trace.info.tags.get("mlflow.trace.spansLocation") == "TRACKING_STORE"
    in_folder = (Path(trace.info.tags["mlflow.artifactLocation"].removeprefix("file://")) / "traces.json").is_file()
    assert (in_store, in_folder) == (trace_spans == "store", trace_spans == "artifact")
    assert trace.info.token_usage == {
        "input_tokens": 230,
        "output_tokens": 25,
        "total_tokens": 255,
        "cache_read_input_tokens": 60,
        "cache_creation_input_tokens": 0,
    }
    assert (trace.info.state, trace.info.request_time, trace.info.execution_duration) == ("OK", 1_796_000_000_000, 8000)
    assert "make it fast" in trace.info.request_preview and "model_stopped" in trace.info.response_preview
    assert (
        json.loads(trace.info.trace_metadata["mlflow.trace.cost"])["total_cost"] == pytest.approx(0.75)
        and int(trace.info.trace_metadata["mlflow.trace.sizeBytes"]) > 0
    )
    root, *spans = trace.data.spans
    assert (root.name, root.span_type, root.inputs, root.outputs["reason"]) == (
        cell.label,
        "AGENT",
        {"prompt": "make it fast"},
        "model_stopped",
    )
    assert [(s.name, s.span_type) for s in spans] == [
        ("turn 1", "CHAT_MODEL"),
        ("run_check", "TOOL"),
        ("turn 2", "CHAT_MODEL"),
    ]
    first, tool, second = spans
    assert [m["role"] for m in first.inputs["messages"]] == ["system", "user"] and second.inputs["messages"][0][
        "content"
    ] == "PASS 3/3"
    assert first.outputs["choices"][0]["message"]["tool_calls"] == [call] and first.attributes["mlflow.llm.cost"] == {
        "total_cost": 0.25
    }
    assert (tool.inputs, tool.outputs) == ({"path": "solution.py"}, {"result": "PASS 3/3"})
    assert (first.start_time_ns, first.end_time_ns, tool.end_time_ns) == (
        1_796_000_002 * 10**9,
        1_796_000_004 * 10**9,
        1_796_000_006 * 10**9,
    )
    assert [e.name for e in root.events] == ["retry"]
    # what ran it: the source and the checkout's commit, on the sweep and cell runs
    tags = tracker.client.get_run(run_id).data.tags
    assert tags["mlflow.source.name"] == "kbsweep" and len(tags["mlflow.source.git.commit"]) == 40


def test_a_trace_the_store_refuses_is_raised_and_the_next_is_logged(store):
    """The writer's exporter runs inside OpenTelemetry's span processor, which would log a failure and go on: the
    store's error reaches the caller, and the writer still logs the next trace whole."""
    from mlflow.exceptions import MlflowException

    from kbsweep.agent.mlflow_trace import TraceWriter

    outputs, uri = store
    tracker = Tracker(uri, str(outputs / "mlartifacts"), "demo")  # the trace's spans go under the test's folder
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    writer = TraceWriter(uri)
    with pytest.raises(MlflowException):
        writer.log("424242", run_id, EVENTS, "no such experiment", "m")
    trace_id = writer.log(tracker.experiment_id, run_id, EVENTS, "logged", "m")
    [trace] = tracker.client.search_traces(locations=[tracker.experiment_id], run_id=run_id)
    assert trace.info.trace_id == trace_id and [s.name for s in trace.data.spans] == ["logged", "turn 1"]
