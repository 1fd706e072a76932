"""The MLflow store: one client per URI and process, an SQLite store created whole, and its runs read back as rows
for boards, exports, resume and regrade. The writer is :mod:`kbsweep.tracking.tracker`."""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

from kbsweep.errors import InfraError
from kbsweep.paths import user_cache

KIND_TAG = "kbsweep.kind"


CELL_KEY_TAG = "kbsweep.cell_key"


PAGE = 1000  # runs a search request returns


def run_pages(client, experiment_ids: List[str], filter_string: str) -> Iterator[List[Any]]:
    """Every matching run, a page at a time. MLflow builds an ORM object for each of a run's params, tags and metrics
    (~70 a cell run), and Python's collector walking a heap that grew by them took ~60% of reading 10 000 runs of
    ~150: it is paused while a page is read. Pages of 1 000 bound what a read holds at once (10 000 runs of ~150 in
    one page: 2.2 GB)."""
    token = None
    while True:
        paused = gc.isenabled()
        gc.disable()
        try:
            page = client.search_runs(experiment_ids, filter_string=filter_string, max_results=PAGE, page_token=token)
        finally:
            if paused:
                gc.enable()
        yield page
        token = page.token
        if not token:
            return


def page_runs(client, experiment_ids: List[str], filter_string: str) -> List[Any]:
    """Every matching run (:func:`run_pages`)."""
    return [run for page in run_pages(client, experiment_ids, filter_string) for run in page]


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
    that process's folder and time, so the template keeps none).

    The store keeps SQLite's rollback journal: a write-ahead log (WAL) took 2-9 CPU-ms a cell off the orchestrator's
    tracking on a fresh store and none measurable on one of 10 000 cells (docs/benchmarks.md, "Sweeps at scale"),
    but every reader of a WAL database must be on the writer's host, and Slurm cells on other nodes read this store
    (the audit's run lookup)."""
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


QUIET_LOGGERS = (
    "mlflow.store",
    "alembic",
)  # MLflow's store and its migrations: their INFO lines say nothing to a sweep's reader


def mlflow_defaults() -> None:
    """The settings kbsweep's processes give MLflow and litellm (its cost map read from the package, never fetched),
    each unless the user set it: at the entry point, before MLflow is first imported, and again where a client is made.
    MLflow's store and migrations log their warnings and errors only (:data:`QUIET_LOGGERS`)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault(
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"
    )  # a bar per downloaded artifact floods export and regrade
    # MLflow's usage telemetry: a thread per process posting each client call's event to MLflow's servers, which a
    # cluster's nodes may not reach and a benchmark's runs need not report to
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # a tracking server's requests: 4 retries 0, 2, 4 and 8 s apart (~15 s), where MLflow's 7 with a factor of 2 waited
    # ~250 s on a server that had gone, for every call of a sweep
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "4")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    if (
        "MLFLOW_LOGGING_LEVEL" not in os.environ
    ):  # e.g. a new store's "Creating initial MLflow database tables", one per first run
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


SERVER_WAIT_S = 3.0  # how long a tracking server is asked whether it answers before a verb gives up on it


def server_down(uri: str, wait_s: float = SERVER_WAIT_S) -> Optional[str]:
    """Why nothing answers at the tracking server ``uri`` (its ``/health``, asked again for ``wait_s`` while a
    connection is refused or times out), or None: it answers (any HTTP status), or ``uri`` is no server's."""
    if not uri.startswith(("http://", "https://")):
        return None
    import socket
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(
                f"{uri.rstrip('/')}/health", timeout=max(0.5, min(3.0, deadline - time.monotonic()))
            ):
                return None
        except urllib.error.HTTPError:
            return None  # something answers: MLflow's own requests say what
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            why = (
                "name not resolved"
                if isinstance(reason, socket.gaierror)
                else "connection refused"
                if isinstance(reason, ConnectionRefusedError)
                else "no answer"
                if isinstance(reason, (socket.timeout, TimeoutError))
                else str(reason)
            )
        if time.monotonic() + 0.5 >= deadline:
            return why
        time.sleep(0.5)


def require_server(uri: str) -> None:
    """InfraError, one line, when no tracking server answers at ``uri`` (:func:`server_down`)."""
    why = server_down(uri)
    if why:
        raise InfraError(f"no MLflow server answers at {uri} ({why}); start one with scripts/mlflow_server.sh")


@functools.lru_cache(maxsize=None)
def make_client(uri: str):
    """The process's one MLflow client of ``uri`` (creating an SQLite store on first use; a tracking server must
    answer first, :func:`require_server`)."""
    mlflow_defaults()
    require_server(uri)
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///") :])
        if not path.exists():
            create_sqlite_store(path)
    return MlflowClient(tracking_uri=uri)


def runs_frame(uri: str, experiments: Optional[Iterable[str]] = None, kind: str = "cell") -> List[Dict[str, Any]]:
    """Every cell run (or run of another ``kind``: regrade) of the store (or of the named experiments) as plain
    rows: tags and metrics at the top level, params under ``params``, plus run id, artifact URI, status, start time
    and experiment name."""
    client = make_client(uri)
    names = set(experiments or [])
    found = {e.experiment_id: e.name for e in client.search_experiments() if not names or e.name in names}
    if not found:
        return []
    rows = []
    shared: Dict[str, str] = {}  # one copy of each string: a sweep's runs repeat most keys and values
    one = lambda text: shared.setdefault(text, text)  # noqa: E731
    for page in run_pages(client, list(found), f"tags.`{KIND_TAG}` = '{kind}'"):
        for run in page:
            tags = run.data.tags
            rows.append(
                {
                    **{one(k): one(v) for k, v in tags.items() if not k.startswith("mlflow.")},
                    **{one(k): v for k, v in run.data.metrics.items()},
                    "cell_key": tags.get(CELL_KEY_TAG),
                    "params": {one(k): one(v) for k, v in run.data.params.items()},
                    "run_id": run.info.run_id,
                    "artifact_uri": run.info.artifact_uri,
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
            client.search_runs(
                [experiment.experiment_id],
                f"tags.`{KIND_TAG}` = 'sweep'",
                max_results=1,
                order_by=["attributes.start_time DESC"],
            )
            if experiment
            else []
        )
        if runs:
            client.log_artifacts(runs[0].info.run_id, str(folder), "report")
            logged.append(runs[0].info.run_id)
    return logged


MLFLOW_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default
RUNS_VIEW = "kbsweep-cells"  # the share key of the runs view the link opens
RUNS_VIEW_COLUMNS = (
    "metrics.`score`",
    "tags.`outcome`",
    "tags.`verdict`",
    "tags.`model`",
    "tags.`problem`",
    "metrics.`cost_usd`",
)


def runs_view_tag() -> Dict[str, str]:
    """The experiment tag that holds the runs view :func:`runs_link` opens (MLflow's shared view state, read by its UI
    from ``mlflow.sharedViewState.<key>``): these columns, the best score first, the runs grouped by kind (``cell``
    and ``sweep``), so every cell run is a row of the table where nested under its sweep's run it is folded away."""
    state = {
        "selectedColumns": list(RUNS_VIEW_COLUMNS),
        "orderByKey": "metrics.`score`",
        "orderByAsc": False,
        "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": KIND_TAG}]},
    }
    return {f"mlflow.sharedViewState.{RUNS_VIEW}": json.dumps(state)}


def runs_link(uri: str, sweep: str, experiment_id: Optional[str] = None) -> str:
    """Where a sweep's runs are in MLflow's UI: its runs table in the view of :func:`runs_view_tag` (its experiment's id
    asked of MLflow unless given: a board read back from the snapshot carries it, and a resumed finished sweep then
    never imports MLflow). MLflow 3.17's UI opens an experiment on its GenAI overview unless the address asks for the
    model-training view (``workflowType=machine_learning``, the GenAI | Model training switch): while it shows that
    switch it ignores the experiment's ``mlflow.experimentKind`` tag."""
    if experiment_id is None:
        experiment = make_client(uri).get_experiment_by_name(sweep)
        experiment_id = experiment.experiment_id if experiment else None
    page = (
        f"#/experiments/{experiment_id}/runs?viewStateShareKey={RUNS_VIEW}&workflowType=machine_learning"
        if experiment_id
        else "#/experiments"
    )
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/{page}"
    return f"mlflow ui --backend-store-uri {uri}, then {MLFLOW_UI}/{page}"
