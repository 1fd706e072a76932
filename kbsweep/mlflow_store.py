"""The MLflow store: one client per URI and process, an SQLite store created whole, and its runs read back as rows
for boards, exports, resume and regrade. The writer is :mod:`kbsweep.tracking`."""
from __future__ import annotations

import contextlib
import functools
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional

from kbsweep.paths import user_cache

KIND_TAG = "kbsweep.kind"


CELL_KEY_TAG = "kbsweep.cell_key"


def page_runs(client, experiment_ids: List[str], filter_string: str) -> List[Any]:
    """Every matching run (search_runs pages through at most 50,000 at a time)."""
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string=filter_string, max_results=50_000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def create_sqlite_store(path: Path) -> None:
    """Create an MLflow sqlite database whole or not at all (:func:`build_whole`): a copy of :func:`empty_store`,
    opened by MLflow, which adds its Default experiment. Two sweeps starting together on a fresh folder would
    otherwise race, and a run killed while creating it would leave a half-made database that breaks every later run."""
    template = empty_store()

    def build(partial: Path) -> None:
        shutil.copyfile(template, partial)
        open_store(partial)

    build_whole(path, build)


def empty_store() -> Path:
    """An sqlite store at MLflow's schema with no experiment, made once per MLflow and SQLAlchemy version in the
    user's cache: a store made from scratch runs MLflow's ~70 Alembic migrations, ~1.9 CPU-s for every new
    outputs folder (docs/benchmarks.md). Its copy is opened by MLflow, which then adds the Default experiment as on a fresh store (with
    that process's folder and time, so the template keeps none)."""
    import sqlite3
    from importlib.metadata import version

    def build(partial: Path) -> None:
        open_store(partial)
        with contextlib.closing(sqlite3.connect(partial)) as db, db:
            db.execute("DELETE FROM experiments")

    path = user_cache() / f"mlflow-{version('mlflow')}-sqlalchemy-{version('sqlalchemy')}.db"
    build_whole(path, build)
    return path


def open_store(path: Path) -> None:
    """Open ``path`` as MLflow's sqlite store: migrated to its schema and given its Default experiment if new."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service.utils import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH

    SqlAlchemyStore(f"sqlite:///{path}", DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH).engine.dispose()


def build_whole(path: Path, build: Callable[[Path], None]) -> None:
    """Unless ``path`` exists: ``build`` a partial file of its own, renamed into place after, under a lock of
    ``path`` (another process building it meanwhile makes this one build nothing). Partial files left by a
    builder killed mid-way go first."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return
        for stale in path.parent.glob(f".{path.name}.*.partial*"):
            stale.unlink()
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        build(partial)
        os.replace(partial, path)


@functools.lru_cache(maxsize=None)
def make_client(uri: str):
    """The process's one MLflow client of ``uri`` (creating an SQLite store on first use)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per downloaded artifact floods export and regrade
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///") :])
        if not path.exists():
            create_sqlite_store(path)
    return MlflowClient(tracking_uri=uri)


def runs_frame(uri: str, experiments: Optional[Iterable[str]] = None, kind: str = "cell") -> List[Dict[str, Any]]:
    """Every cell run (or run of another ``kind``: regrade) of the store (or of the named experiments) as plain
    rows: tags and metrics at the top level, params under ``params``, plus run id, status, start time and
    experiment name."""
    client = make_client(uri)
    names = set(experiments or [])
    found = {e.experiment_id: e.name for e in client.search_experiments() if not names or e.name in names}
    if not found:
        return []
    rows = []
    for run in page_runs(client, list(found), f"tags.`{KIND_TAG}` = '{kind}'"):
        tags = run.data.tags
        rows.append(
            {
                **{k: v for k, v in tags.items() if not k.startswith("mlflow.")},
                **run.data.metrics,
                "cell_key": tags.get(CELL_KEY_TAG),
                "params": run.data.params,
                "run_id": run.info.run_id,
                "status": run.info.status,
                "start_time": run.info.start_time,
                "experiment": found[run.info.experiment_id],
            }
        )
    return rows


def latest_per_cell(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The latest FINISHED run of each cell key, whatever sweep logged it (a --force rerun supersedes the older record)."""
    latest: Dict[str, Dict[str, Any]] = {}
    for row in rows:
        if row.get("status") != "FINISHED":
            continue
        key = row.get("cell_key") or row["run_id"]
        if key not in latest or row["start_time"] > latest[key]["start_time"]:
            latest[key] = row
    return sorted(latest.values(), key=lambda r: r["start_time"])


def log_report(uri: str, experiments: Iterable[str], folder: Path) -> List[str]:
    """Log a report folder under ``report/`` of the latest sweep run of each experiment; returns those run ids."""
    client = make_client(uri)
    logged = []
    for name in experiments:
        experiment = client.get_experiment_by_name(name)
        runs = (
            client.search_runs([experiment.experiment_id], f"tags.`{KIND_TAG}` = 'sweep'", max_results=1, order_by=["attributes.start_time DESC"])
            if experiment
            else []
        )
        if runs:
            client.log_artifacts(runs[0].info.run_id, str(folder), "report")
            logged.append(runs[0].info.run_id)
    return logged
