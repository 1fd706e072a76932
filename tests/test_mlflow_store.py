"""A new outputs folder's sqlite store, copied from the empty store in the user's cache: the same schema and rows as
the store MLflow makes from scratch (its Default experiment from the process that creates the copy), and no
migration run once the empty store exists."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import mlflow.store.db.utils
import pytest

from kbsweep.tracking import mlflow_store

REPO = Path(__file__).resolve().parent.parent


def dump(path: Path) -> list:
    """The store's statements, each as its sorted lines: MLflow's migrations order a table's constraints, and the
    indexes, differently from one run to the next (two stores made from scratch differ so)."""
    with sqlite3.connect(path) as db:
        return sorted(
            tuple(sorted(line.strip().rstrip(",").strip() for line in statement.splitlines()))
            for statement in db.iterdump()
        )


def default_experiment(path: Path) -> tuple:
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT name, artifact_location, lifecycle_stage FROM experiments WHERE experiment_id = 0"
        ).fetchone()


@pytest.mark.fast
def test_a_copied_store_is_the_store_mlflow_makes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")  # MLflow names the Default experiment's folder after the process's folder
    mlflow_store.open_store(tmp_path / "scratch.db")  # MLflow's own: every migration
    mlflow_store.create_sqlite_store(tmp_path / "copied.db")
    assert mlflow_store.empty_store().exists()
    without_default = lambda path: [s for s in dump(path) if not s[0].startswith('INSERT INTO "experiments"')]  # noqa: E731
    assert without_default(tmp_path / "copied.db") == without_default(tmp_path / "scratch.db")
    assert (
        default_experiment(tmp_path / "copied.db")
        == default_experiment(tmp_path / "scratch.db")
        == ("Default", f"{tmp_path}/a/mlruns/0", "active")
    )

    def migrate(engine):
        raise AssertionError("a store was migrated while the empty store existed")

    monkeypatch.setattr(mlflow.store.db.utils, "_upgrade_db", migrate)
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    mlflow_store.create_sqlite_store(tmp_path / "second.db")
    assert default_experiment(tmp_path / "second.db")[1] == f"{tmp_path}/b/mlruns/0"  # nothing of the first process's
    client = mlflow_store.make_client(f"sqlite:///{tmp_path}/second.db")
    run = client.create_run(client.create_experiment("demo")).info.run_id
    client.log_metric(run, "score", 0.5)
    assert client.get_run(run).data.metrics == {"score": 0.5}


def test_processes_creating_the_empty_store_at_once_leave_one_whole_store(tmp_path):
    """Three processes on a cold cache and three new folders: each store opens, one empty store, no partial file."""
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); from kbsweep.tracking import mlflow_store; "
        "mlflow_store.create_sqlite_store(Path(sys.argv[2])); print(mlflow_store.empty_store())"
    )
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(REPO), str(tmp_path / f"out{i}" / "mlflow.db")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    assert len({out.strip() for out, _ in outs}) == 1
    cache = tmp_path / "cache" / "kbsweep"
    assert [p.name for p in cache.iterdir() if p.suffix == ".db"] == [Path(outs[0][0].strip()).name]
    assert not [p for p in tmp_path.rglob("*partial*")]
    for i in range(3):
        assert default_experiment(tmp_path / f"out{i}" / "mlflow.db")[0] == "Default"


@pytest.mark.fast
def test_a_sweep_process_sends_no_mlflow_telemetry_unless_its_user_asks(tmp_path):
    """MLflow reads its telemetry switch when it is imported: the CLI's process (and the workers it starts) must
    have it set by then. Checked in a fresh interpreter without the CI markers that turn telemetry off anyway."""
    probe = (
        "import os, sys; sys.argv = ['kbsweep', 'plan', 'gpu=cpu', 'preflight=off']\n"
        "from kbsweep.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "from mlflow.telemetry.utils import is_telemetry_disabled\n"
        "print(os.environ['MLFLOW_DISABLE_TELEMETRY'], is_telemetry_disabled())"
    )
    quiet = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CI", "PYTEST_CURRENT_TEST", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK")
    }

    def run(env):
        return subprocess.run(
            [sys.executable, "-c", probe],
            env={**quiet, "KBSWEEP_OUTPUTS": str(tmp_path), **env},
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout.split()[-2:]

    assert run({}) == ["true", "True"]
    assert run({"MLFLOW_DISABLE_TELEMETRY": "false"})[0] == "false"


def test_a_first_sweep_prints_none_of_mlflows_info_lines_and_keeps_its_warnings(tmp_path):
    """A fresh outputs folder and user cache: the store is made from scratch (MLflow's migrations), quietly."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "MLFLOW_LOGGING_LEVEL"},
        "KBSWEEP_OUTPUTS": str(tmp_path / "outputs"),
        "KBSWEEP_LOCK_DIR": str(tmp_path / "locks"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    command = [
        sys.executable,
        "-m",
        "kbsweep.cli",
        "track=instant",
        "model=instant",
        "gpu=cpu",
        "problem=scale_shift",
        "launcher=inline",
    ]
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "outputs" / "mlflow.db").exists() and list(
        (tmp_path / "cache").rglob("mlflow-*.db")
    )  # both made here
    assert "Creating initial MLflow database tables" not in run.stderr and " INFO mlflow.store" not in run.stderr, (
        run.stderr
    )
    assert " INFO alembic" not in run.stderr
    mlflow_store.mlflow_defaults()
    assert all(logging.getLogger(name).isEnabledFor(logging.WARNING) for name in mlflow_store.QUIET_LOGGERS)
