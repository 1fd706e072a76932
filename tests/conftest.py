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
