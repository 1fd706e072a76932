"""A GPU box: a sweep asking for more GPUs than the machine offers is refused in one line before anything runs
(the GPU list faked, as tests/test_launch.py fakes it), and pyproject's cpu extra pins versions its ranges admit
(a GPU host installs the ranges and keeps its own builds)."""

from __future__ import annotations

import os
import sqlite3
import tomllib

import pytest
from packaging.requirements import Requirement

from kbsweep import KbsweepError
from kbsweep.api import run
from kbsweep.config import gpus
from tests.conftest import REPO, kbsweep

pytestmark = pytest.mark.fast


def sweep_runs(outputs) -> list:
    """The sweep runs in the outputs' MLflow store (none where it was never made)."""
    if not (outputs / "mlflow.db").exists():
        return []
    with sqlite3.connect(outputs / "mlflow.db") as db:
        return db.execute("SELECT name FROM runs").fetchall()


def test_more_gpus_than_the_machine_offers_is_one_line_before_the_preflight(outputs):
    """Two GPUs in CUDA_VISIBLE_DEVICES (entries NVML does not list keep their own text), a multi cell of 8: the
    refusal comes before the live preflight (whose missing key would be the error otherwise) and any run."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    proc = kbsweep(
        "model=opus-4.8",
        "gpu=h200",
        "track=multi",
        "problem=allreduce_residual",
        env={**env, "CUDA_VISIBLE_DEVICES": "0,1"},
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("kbsweep: error:")]
    assert proc.returncode == 2, proc.stderr
    assert errors == [line for line in proc.stderr.splitlines() if not line.startswith("[kbsweep]")], proc.stderr
    assert len(errors) == 1 and "needs 8 GPU(s); this machine offers 2" in errors[0], proc.stderr
    assert sweep_runs(outputs) == []


def test_a_gpu_cell_on_a_machine_without_gpus_is_told_to_use_gpu_cpu(outputs, monkeypatch):
    monkeypatch.setattr(gpus, "list_gpus", lambda: [])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(KbsweepError, match=r"needs 1 GPU\(s\); this machine offers 0 .* use gpu=cpu"):
        run("model=scripted", "gpu=h200", "track=hard", "problem=topk", "preflight=off")
    assert sweep_runs(outputs) == []


def test_cpu_extra_pins_versions_inside_the_ranges():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ranges = {Requirement(spec).name.lower(): Requirement(spec).specifier for spec in project["dependencies"]}
    for spec in project["optional-dependencies"]["cpu"]:
        pinned = Requirement(spec)
        version = next(iter(pinned.specifier)).version
        assert pinned.name.lower() not in ranges or ranges[pinned.name.lower()].contains(version), spec
