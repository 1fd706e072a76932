"""Shared fixtures: an isolated outputs folder, the demo problem and the CPU's roofline to grade against, and a
way to run the real `kbsweep` command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def outputs(tmp_path, monkeypatch) -> Path:
    """A fresh outputs root (tracking store, sweeps, baselines) for one test."""
    folder = tmp_path / "outputs"
    monkeypatch.setenv("KBSWEEP_OUTPUTS", str(folder))
    monkeypatch.setenv("KBSWEEP_LOCK_DIR", str(tmp_path / "locks"))
    return folder


def kbsweep(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run the installed CLI as a user would; returns the completed process (text)."""
    full_env = {**os.environ, **(env or {})}
    command = [sys.executable, "-m", "kbsweep.cli", *args]
    return subprocess.run(command, cwd=cwd or REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def problem():
    """demo/scale_shift, the problem most grading tests grade against."""
    from kbsweep.config.problems import load_problem

    return load_problem(REPO / "problems/demo/scale_shift", "demo")


@pytest.fixture(scope="session")
def roofline():
    """The CPU's roofline spec: what a grade on this machine scores against."""
    from kbsweep.score.roofline import load_roofline

    return load_roofline([str(REPO / "roofline_specs")], "cpu")


@pytest.fixture(scope="session")
def cases_home(tmp_path_factory) -> Path:
    """Kept across audit cases in this process: their problem copies and the runner zygote's home, so cases of a
    problem fork from warm zygotes as a sweep's cells do (kbsweep.audit.cases.run_case's ``shared``)."""
    return tmp_path_factory.mktemp("cases")


@pytest.fixture(scope="session")
def store_template(tmp_path_factory) -> Path:
    """An initialized empty sqlite store; tests copy it (creating the schema takes seconds)."""
    from kbsweep.tracking.mlflow_store import make_client

    folder = tmp_path_factory.mktemp("mlflow-template")
    make_client(f"sqlite:///{folder}/mlflow.db").search_experiments()
    return folder / "mlflow.db"


@pytest.fixture
def store(tmp_path, store_template):
    """(outputs folder, sqlite tracking URI inside it), the store already initialized."""
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    shutil.copy(store_template, outputs / "mlflow.db")
    return outputs, f"sqlite:///{outputs}/mlflow.db"


@pytest.fixture
def cli():
    return kbsweep
