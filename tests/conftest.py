"""Shared fixtures: an isolated outputs folder and a way to run the real `kbsweep` command."""
from __future__ import annotations

import os
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


def kbsweep(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the installed CLI as a user would; returns the completed process (text)."""
    full_env = {**os.environ, **(env or {})}
    command = [sys.executable, "-m", "kbsweep.cli", *args]
    return subprocess.run(command, cwd=cwd or REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli():
    return kbsweep


# ---- pytest-xdist (scripts/test.sh runs `-n 2 --dist loadgroup`): tests that share something stay on one worker ----

SHARED_FIXTURES = {  # fixture → group: an expensive fixture made once per worker that uses it
    "recorded": "agent-sweep-recorded",  # test_agent_sweep: one whole sweep
    "adversarial": "multi-adversarial",  # test_multi: four concurrent grades
    "served": "mlflow-server",  # test_tracking_server and test_browser_mlflow_ui: one server and sweep, cached on config
}
SHARED_MODULES = {
    "test_slurm": "slurm",  # one Slurm: a preempting job must find only its own test's jobs
    "test_sandbox": "fork-bomb",  # counts every `kbsweep-bomb` process on the machine
    "test_adversarial_agent": "fork-bomb",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): tests of one group run on the same xdist worker, one at a time")


def pytest_collection_modifyitems(config, items):
    for item in items:
        group = SHARED_MODULES.get(item.module.__name__.rpartition(".")[2])
        group = group or next((g for f, g in SHARED_FIXTURES.items() if f in getattr(item, "fixturenames", ())), None)
        if item.name.startswith("test_a_job_slurm_refuses"):  # test_malformed's Slurm submission
            group = "slurm"
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
