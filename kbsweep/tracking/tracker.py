"""The tracking stage: MLflow holds every sweep (parent run) and cell (child run) with its evidence; this module
writes it, :mod:`kbsweep.tracking.mlflow_store` opens the store and reads runs back.

One experiment per sweep name, one parent run per invocation, one child run per cell. A cell run has the
labels boards filter on (tags), the config the boards and the audit read with its problem's roofline and its
harness setup (params), per-shape and summary numbers and the agent loop's progress (metrics), and the evidence
with its whole resolved config (artifacts). Only the orchestrator writes here; cells
write ``result.json`` journals that are logged when they come back, so a killed sweep loses no finished cell.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import socket
import tempfile
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

from kbsweep.outcomes import Outcome
from kbsweep.planner.matrix import Cell
from kbsweep.tracking.cell_result import CellResult
from kbsweep.tracking.mlflow_store import CELL_KEY_TAG, KIND_TAG, make_client, page_runs, run_pages, runs_view_tag

ARTIFACTS = ("solution.py", "transcript.jsonl", "harness_stream.jsonl", "grade.json", "audit.json", "result.json")
OWNER_TAG = "kbsweep.orchestrator"  # host:pid of the process that created the run
RESULT_TAG = "kbsweep.result"  # which result.json a cell run records (see result_id)
BATCH = {
    "params": 100,
    "tags": 100,
    "metrics": 800,
}  # per request; MLflow takes at most 1000 entities of all kinds in one
BAD_KEY_CHARS = re.compile(r"[^\w./\- :]")
VERSIONED_PACKAGES = ("kbsweep", "mlflow", "litellm", "torch", "triton", "hydra-core", "submitit", "nvidia-ml-py")


def flatten(prefix: str, value: Any, out: Dict[str, str]) -> Dict[str, str]:
    """Nested config → ``a.b.c: str`` params; lists of structures become one JSON value."""
    if isinstance(value, dict):
        for key, sub in value.items():
            flatten(f"{prefix}.{key}" if prefix else str(key), sub, out)
    elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        out[BAD_KEY_CHARS.sub("_", prefix)] = json.dumps(value, default=str)[:6000]
    else:
        out[BAD_KEY_CHARS.sub("_", prefix)] = str(value)[:6000]
    return out


def outcome_class(outcome: str) -> str:
    """pass | fail (the model's own failure, scored 0) | infra (retried, never scored) | audit."""
    value = Outcome(outcome)
    if value == Outcome.PASS:
        return "pass"
    if value.is_infra:
        return "infra"
    return "audit" if value in (Outcome.DISQUALIFIED, Outcome.NEEDS_HUMAN) else "fail"


def result_id(result: CellResult) -> str:
    """Names one result.json: its cell key and the time it was written."""
    return f"{result.key}@{result.finished!r}"


def owner() -> str:
    """This process's stamp: ``host:pid:start`` (its start time tells it from a later process given the same pid)."""
    return f"{socket.gethostname()}:{os.getpid()}:{process_start(os.getpid())}"


def process_start(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def owner_alive(value: Optional[str]) -> bool:
    """False only for a process of this host that no longer runs (``host:pid`` stamps: no process has that pid);
    other hosts' processes are assumed alive."""
    host, pid, start = ((value or "").split(":") + ["", ""])[:3]
    if host != socket.gethostname() or not pid.isdigit():
        return True
    found = process_start(int(pid))
    return found is not None and start in ("", found)


@functools.lru_cache(maxsize=None)
def versions() -> Dict[str, str]:
    """Versions of Python and of the installed packages a result depends on (the grader's torch/triton come as env.*);
    read once a process (reading each package's metadata took ~5 ms a cell). Callers copy it."""
    found = {"version.python": platform.python_version()}
    for package in VERSIONED_PACKAGES:
        try:
            found[f"version.{package}"] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return found


def provider_of(model: Dict[str, Any]) -> str:
    """Who serves the model: the litellm route's provider (``anthropic``, ``openai``, ...), else the model's kind."""
    return str(model["route"]).split("/")[0] if model.get("route") else str(model.get("provider"))


# The config keys a cell run carries as params beside its tags' labels (model, harness, track, gpu, problem, repeat,
# deck version): what the boards and the audit read and what tells apart cells whose labels match. The whole resolved
# config is the run's CONFIG_ARTIFACT. Each param is an entry of the store's indexes, the dearer the bigger the store:
# the whole config as 94 params cost 7-9 CPU-ms a cell more (docs/benchmarks.md, "Sweeps at scale": "A cell's params").
CONFIG_PARAMS = (
    "model.route",
    "model.reasoning_effort",
    "harness.version",
    "gpu.device",
    "track.problems_dir",
    "track.format",
    "track.kernelbench_version",
)
CONFIG_ARTIFACT = "config.json"


def cell_config(cell: Cell) -> Dict[str, Any]:
    """The cell's resolved config: its model, harness, GPU, track, grade and audit judge settings, paths, problem and
    repeat (the launcher's are its sweep run's params)."""
    return {
        "model": cell.model,
        "harness": cell.harness,
        "gpu": asdict(cell.gpu),
        "track": cell.track,
        "grade": cell.grade,
        "judge": cell.judge,
        "paths": cell.paths,
        "problem": cell.problem,
        "problem_dir": cell.problem_dir,
        "deck_version": cell.deck_version,
        "repeat": cell.repeat,
    }


def cell_params(cell: Cell) -> Dict[str, str]:
    """The cell's :data:`CONFIG_PARAMS`, its problem's regime and GPU's roofline (the reports' plots) and its harness
    setup. The launcher's settings and the orchestrator's software versions are the same for every cell of an
    invocation: they are its sweep run's params (:meth:`Tracker.start_sweep`)."""
    config = flatten(
        "", {"model": cell.model, "harness": cell.harness, "gpu": {"device": cell.gpu.device}, "track": cell.track}, {}
    )
    params = {key: config.get(key, "None") for key in CONFIG_PARAMS}
    params.update(
        problem_params(
            cell.problem_dir,
            cell.deck_version,
            cell.track["name"],
            tuple(cell.paths["roofline_specs"]),
            cell.gpu.roofline,
        )
    )
    params.update(setup_params(cell))
    return params


def setup_params(cell: Cell) -> Dict[str, str]:
    """``setup.*``: what the cell's harness gives the model (its tools, shell, instructions, how it ends, who checks
    the budgets) and the budgets themselves, as the report compares harnesses by."""
    from kbsweep.harness import runner_for

    track = cell.track
    budgets = " ".join(f"{key}={track.get(key)}" for key in ("time_cap_s", "max_turns", "max_tokens", "max_usd"))
    return flatten("setup", {**runner_for(cell.harness).setup(bool(track["allow_shell"])), "budgets": budgets}, {})


@functools.lru_cache(maxsize=256)
def problem_params(
    problem_dir: str, deck_version: str, track: str, roofline_specs: Tuple[str, ...], roofline_name: str
) -> Dict[str, str]:
    """A problem's regime, peak and score and its GPU's roofline, as params; read once per problem version and GPU a
    process (a sweep's repeats read the same; ``deck_version`` keys it: a changed problem is read again). Callers
    copy it."""
    from kbsweep.config.problems import load_problem
    from kbsweep.score.roofline import load_roofline

    spec = load_problem(Path(problem_dir), track).spec
    roofline = load_roofline(list(roofline_specs), roofline_name)
    params = flatten("roofline", {k: roofline.get(k) for k in ("name", "peaks_tflops", "dram_gbps")}, {})
    return {**params, "problem.regime": spec.regime, "problem.peak": str(spec.peak), "problem.score": spec.score}


def env_params(env: Dict[str, Any]) -> Dict[str, str]:
    """Software versions and GPU identity of the process that graded the cell."""
    params = {f"env.{key}": str(env[key]) for key in ("torch", "triton", "python", "host") if key in env}
    for i, gpu in enumerate(env.get("gpus") or []):
        params.update(
            flatten(f"env.gpu{i}", {k: gpu.get(k) for k in ("name", "uuid", "driver", "memory_total_mib")}, {})
        )
    if env.get("graded_on"):  # of the GPUs above, those the grade ran on
        params["env.graded_on"] = ", ".join(f"{gpu['visible']}: {gpu['name']}" for gpu in env["graded_on"])
    return params


def cell_metrics(result: Dict[str, Any]) -> Dict[str, float]:
    """Per-shape ms, TFLOP/s, GB/s and roofline fractions; summary score, speedups, tokens, dollars, times."""
    from kbsweep.score.roofline import geomean

    metrics: Dict[str, float] = {}
    shapes = result.get("shapes") or []
    for i, shape in enumerate(shapes):
        for key in ("ms", "tflops", "gbps", "fraction", "compute_fraction", "memory_fraction"):
            if shape.get(key) is not None:
                metrics[f"shape{i}.{key}"] = shape[key]
        for name, value in (shape.get("speedup") or {}).items():
            metrics[f"shape{i}.speedup_{name}"] = value
    fractions = [s.get("fraction") for s in shapes]
    fraction_geomean = geomean(fractions) if fractions and None not in fractions else None
    if fraction_geomean is not None:
        metrics["fraction_geomean"] = fraction_geomean
    for name, value in (result.get("speedup") or {}).items():
        if value is not None:
            metrics[f"speedup_{name}"] = value
    for key in ("score", "score_public", "score_held_out"):
        if result.get(key) is not None:
            metrics[key] = result[key]
    metrics["passed"] = 1.0 if result.get("outcome") == Outcome.PASS.value else 0.0
    if result.get("verdicts"):  # a KernelBench problem: its own eval's verdict beside kbsweep's
        metrics["kernelbench_correct"] = 1.0 if result["verdicts"]["kernelbench"] == "correct" else 0.0
        for name, value in (
            (result.get("kernelbench") or {}).get("speedup") or {}
        ).items():  # KernelBench's metrics' figure
            metrics[f"kernelbench_speedup_{name}"] = value
    for prefix, usage in (("tokens", result.get("usage")), ("judge_tokens", result.get("judge_usage"))):
        for key, value in (usage or {}).items():
            metrics[f"{prefix}_{key.replace('_tokens', '')}"] = value
    for key in ("cost_usd", "agent_cost_usd", "judge_cost_usd", "agent_s", "grade_s", "turns"):
        if result.get(key) is not None:
            metrics[key] = result[key]
    if result.get("started") and result.get("finished"):
        metrics["wall_s"] = result["finished"] - result["started"]
    return {k: float(v) for k, v in metrics.items()}


def step_metrics(steps: List[Dict[str, Any]]) -> List[tuple]:
    """(key, value, step) of the loop's progress: best score so far against turn, tokens and micro-dollars."""
    out = []
    for step in steps:
        out += [("loop.tokens", step["tokens"], step["turn"]), ("loop.usd", step["usd"], step["turn"])]
        if step.get("best_score") is not None:
            best = step["best_score"]
            out += [
                ("loop.best_score", best, step["turn"]),
                ("loop.best_score_by_tokens", best, int(step["tokens"])),
                ("loop.best_score_by_microusd", best, int(round(step["usd"] * 1e6))),
            ]
    return out


def artifact_location(uri: str, artifact_root: str, sweep: str) -> Optional[str]:
    """Where a new experiment keeps its artifacts: ``<artifact_root>/<sweep>``; None (the server's proxied store)
    when the root is empty, or a local folder while the store is a remote server."""
    if not artifact_root or ("://" not in artifact_root and uri.startswith(("http://", "https://"))):
        return None
    if "://" in artifact_root:
        return f"{artifact_root.rstrip('/')}/{sweep}"
    return f"{Path(artifact_root).resolve().as_uri()}/{sweep}"


def source_tags() -> Dict[str, str]:
    """What ran the sweep: MLflow's source tags, with the kbsweep checkout's git commit, branch and remote."""
    from mlflow.utils.git_utils import get_git_branch, get_git_commit, get_git_repo_url

    from kbsweep.paths import REPO_ROOT

    tags = {"mlflow.source.name": "kbsweep", "mlflow.source.type": "LOCAL"}
    for key, read in (("commit", get_git_commit), ("branch", get_git_branch), ("repoURL", get_git_repo_url)):
        value = read(str(REPO_ROOT))
        if value:
            tags[f"mlflow.source.git.{key}"] = value
    return tags


class Started(NamedTuple):
    """A cell run started, not finished: what it logs with its result."""

    model: str  # the trace's model label
    key: str
    artifact_uri: str
    params: Dict[str, str]
    config: Dict[str, Any]


class Tracker:
    """An MLflow experiment per sweep name; a parent run per invocation; a child run per cell."""

    def __init__(self, uri: str, artifact_root: str, sweep: str, trace_spans: str = "artifact"):
        from kbsweep.agent.mlflow_trace import TraceWriter

        self.client = make_client(uri)
        self.traces = TraceWriter(uri, trace_spans)
        self.source = source_tags()
        self.uri, self.artifact_root, self.sweep = uri, artifact_root, sweep
        experiment = self.client.get_experiment_by_name(sweep)
        self.existing: Optional[str] = (
            experiment.experiment_id if experiment else None
        )  # the sweep's experiment, if made yet
        self.view = {
            k: v for k, v in runs_view_tag().items() if not experiment or experiment.tags.get(k) != v
        }  # set by the first write
        self.parent_id: Optional[str] = None
        self.started: Dict[str, Started] = {}  # run id -> what a cell started, not finished, logs with its result

    @property
    def experiment_id(self) -> str:
        """The sweep's experiment, created by the first write: a sweep refused before it runs leaves none."""
        if self.existing is None:
            # a "model training" experiment: MLflow's UI opens such on their runs where it reads the tag (3.17 reads
            # its GenAI | Model training switch instead: kbsweep prints the runs' address with the switch set)
            tags = {"mlflow.experimentKind": "custom_model_development", **self.view}
            location = artifact_location(self.uri, self.artifact_root, self.sweep)
            self.existing, self.view = (
                self.client.create_experiment(self.sweep, artifact_location=location, tags=tags),
                {},
            )
        for key, value in self.view.items():  # an experiment made before its link opened this view
            self.client.set_experiment_tag(self.existing, key, value)
        self.view = {}
        return self.existing

    def log_batch(
        self,
        run_id: str,
        params: Optional[Dict[str, str]] = None,
        tags: Optional[Dict[str, str]] = None,
        metrics: Iterable[tuple] = (),
    ) -> None:
        """Params, tags and (key, value, step) metrics in batches within MLflow's request limits, each request
        carrying all three kinds (each request is a transaction of the store's)."""
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        entities: Dict[str, list] = {
            "params": [Param(k, v) for k, v in sorted((params or {}).items())],
            "tags": [RunTag(k, v[:8000]) for k, v in sorted((tags or {}).items())],
            "metrics": [Metric(k, float(v), now, int(s)) for k, v, s in metrics],
        }
        requests = max(-(-len(items) // BATCH[kind]) for kind, items in entities.items())
        for i in range(requests):
            self.client.log_batch(
                run_id, **{kind: items[i * BATCH[kind] : (i + 1) * BATCH[kind]] for kind, items in entities.items()}
            )

    def start_sweep(self, params: Dict[str, Any], cells: int) -> str:
        """The invocation's run: its cell count, the given params (the sweep's launcher settings) and the software
        versions."""
        tags = {KIND_TAG: "sweep", OWNER_TAG: owner(), **self.source}
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=time.strftime("sweep-%Y%m%d-%H%M%S"))
        self.parent_id = run.info.run_id
        self.log_batch(
            self.parent_id, params={"cells": str(cells), **{k: str(v) for k, v in params.items()}, **versions()}
        )
        return self.parent_id

    def end_sweep(self, status: str, metrics: Dict[str, float]) -> None:
        if self.parent_id:
            self.log_batch(self.parent_id, metrics=[(k, v, 0) for k, v in metrics.items()])
            self.client.set_terminated(self.parent_id, status)

    def history(self) -> Tuple[Dict[str, str], Set[str]]:
        """(cell key → run id of its finished, non-infra record: never run again without --force;
        the result ids of every result logged to the end, infra ones included)."""
        done, logged = {}, set()
        for page in run_pages(self.client, [self.existing], f"tags.`{KIND_TAG}` = 'cell'") if self.existing else []:
            for run in page:
                tags = run.data.tags
                if run.info.status not in ("FINISHED", "FAILED"):
                    continue
                logged.add(tags.get(RESULT_TAG))
                if run.info.status == "FINISHED" and not Outcome(tags["outcome"]).is_infra:
                    done[tags[CELL_KEY_TAG]] = run.info.run_id
        return done, logged

    def close_stale(self) -> int:
        """Mark runs left RUNNING by a dead orchestrator of this host as KILLED; returns how many."""
        running = page_runs(self.client, [self.existing], "attributes.status = 'RUNNING'") if self.existing else []
        stale = [r for r in running if not owner_alive(r.data.tags.get(OWNER_TAG))]
        for run in stale:
            self.stop_run(run.info.run_id)
        return len(stale)

    def stop_run(self, run_id: str) -> None:
        """Close the run of a cell or sweep stopped before it finished."""
        self.client.set_terminated(run_id, "KILLED")

    def start_cell(self, cell: Cell) -> str:
        """Open a cell's run with its labels as tags; its params and config are logged with its result, in the
        result's request (:meth:`finish_cell`)."""
        tags = {
            KIND_TAG: "cell",
            CELL_KEY_TAG: cell.key,
            OWNER_TAG: owner(),
            "track": cell.track["name"],
            "problem": cell.problem,
            "gpu": cell.gpu.name,
            "model": cell.model["name"],
            "harness": cell.harness["name"],
            "provider": provider_of(cell.model),
            "repeat": str(cell.repeat),
            "deck_version": cell.deck_version,
            **self.source,
        }
        if self.parent_id:
            tags["mlflow.parentRunId"] = self.parent_id
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=cell.label.replace(" · ", "_"))
        self.started[run.info.run_id] = Started(
            cell.model.get("route") or cell.model["name"],
            cell.key,
            run.info.artifact_uri,
            cell_params(cell),
            cell_config(cell),
        )
        return run.info.run_id

    def finish_cell(self, run_id: str, result: CellResult, live_metrics: Iterable[tuple] = ()) -> str:
        """Log a cell's result (metrics, tags, params, artifacts, its config, trace) and close its run; returns the run id.
        Metrics are named after the stored journal's keys, so they read its stored form; ``live_metrics``, (key,
        value, step) of its progress not logged yet, go in the same request.

        No plots: the loop's progress is the ``loop.best_score*`` metrics, which MLflow charts, and the cell's shapes
        on the roofline are in the report's plot of its problem (every repeat's points); drawing both here cost
        0.8-1 CPU-s a cell, most of what the orchestrator spent on a cell (docs/benchmarks.md, "The 100-cell demo sweep")."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        from kbsweep.agent.trace_export import trace_jsonl
        from kbsweep.agent.transcript import read_events
        from kbsweep.score.roofline import shape_label

        stored = result.to_json()
        metrics = (
            [(k, v, 0) for k, v in cell_metrics(stored).items()] + step_metrics(result.steps or []) + list(live_metrics)
        )
        tags = {
            RESULT_TAG: result_id(result),
            "outcome": result.outcome.value,
            "outcome_class": outcome_class(result.outcome.value),
            "verdict": str(result.verdict),
            "stop_reason": str(result.stop_reason),
            **{f"verdict.{name}": str(v) for name, v in (result.verdicts or {}).items()},
        }
        if result.message:
            tags["message"] = str(result.message)
        off = sorted({name for s in result.shapes for name in s.baselines_outside_tolerance})
        if off:  # their speedups stand, but over a baseline whose output missed the problem's tolerance on some shape
            tags["baselines_outside_tolerance"] = ",".join(off)
        started = self.started[run_id]
        params = {
            **started.params,
            **{f"shape{i}": shape_label(s.shape) for i, s in enumerate(result.shapes)},
            **env_params(result.env or {}),
        }
        self.log_batch(run_id, params=params, tags=tags, metrics=metrics)
        del self.started[run_id]
        folder = Path(result.folder or "")
        artifacts = get_artifact_repository(
            started.artifact_uri, tracking_uri=self.client.tracking_uri
        )  # the client's would read the run back
        for name in ARTIFACTS:
            if (folder / name).exists():
                artifacts.log_artifact(str(folder / name))
        with tempfile.TemporaryDirectory() as scratch:
            written = Path(scratch) / CONFIG_ARTIFACT
            written.write_text(json.dumps(started.config, indent=1, default=str))
            artifacts.log_artifact(str(written))
            if (folder / "transcript.jsonl").exists():
                title = str(result.cell or run_id)
                events = read_events(folder / "transcript.jsonl")
                (Path(scratch) / "trace.jsonl").write_text(trace_jsonl(events, run_id, title, started.model))
                artifacts.log_artifact(str(Path(scratch) / "trace.jsonl"))
                self.traces.log(self.experiment_id, run_id, events, title, started.model, {CELL_KEY_TAG: started.key})
        self.client.set_terminated(run_id, "FAILED" if result.outcome.is_infra else "FINISHED")
        return run_id
