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


# ---- pytest-xdist: scripts/test.sh runs `-n 2 --dist loadgroup`. Tests that share something run on one worker, one
# after another. xdist's own loadgroup reads `xdist_group` marks through a node id suffix that pytest 9 no longer
# lets it set, so the groups are named here, by node id, and a scheduler of our own keeps each group together.

GROUPS = {  # node id prefix → group
    "tests/test_slurm.py::": "slurm",  # one Slurm: a preempting job must find only its own test's jobs
    "tests/test_malformed.py::test_a_job_slurm_refuses": "slurm",
    "tests/test_sandbox.py::": "fork-bomb",  # both count every `kbsweep-bomb` process on the machine
    "tests/test_adversarial_agent.py::": "fork-bomb",
    "tests/test_tracking_server.py::": "mlflow-server",  # one server and sweep, cached on the config (`served`)
    "tests/test_browser_mlflow_ui.py::": "mlflow-server",
}
SHARED_FIXTURES = {  # an expensive module fixture: its tests must be in its group, or each worker makes it again
    "recorded": "agent-sweep-recorded",  # test_agent_sweep: one whole sweep
    "adversarial": "multi-adversarial",  # test_multi: four concurrent grades
    "served": "mlflow-server",
}
FIXTURE_USERS = {
    "tests/test_agent_sweep.py::test_multi_turn_fix_survives_every_recoverable_fault": "agent-sweep-recorded",
    "tests/test_agent_sweep.py::test_cost_and_tokens_per_run": "agent-sweep-recorded",
    "tests/test_agent_sweep.py::test_the_key_is_sent_but_never_written": "agent-sweep-recorded",
    "tests/test_agent_sweep.py::test_replay_reproduces_the_solution_and_outcome": "agent-sweep-recorded",
    "tests/test_multi.py::test_monkeypatched_reference_collective_is_disqualified": "multi-adversarial",
    "tests/test_multi.py::test_a_crashed_rank_is_the_cause_not_its_peers_broken_connection": "multi-adversarial",
    "tests/test_multi.py::test_a_rank_over_the_memory_cap_ends_the_grade": "multi-adversarial",
    "tests/test_multi.py::test_the_slowest_rank_is_what_is_reported": "multi-adversarial",
}


def xdist_group(nodeid: str) -> str | None:
    bare = nodeid.partition("[")[0]
    return FIXTURE_USERS.get(bare) or next((g for prefix, g in GROUPS.items() if bare.startswith(prefix)), None)


def pytest_collection_modifyitems(config, items):
    """A test that uses a shared fixture must be in that fixture's group (else FIXTURE_USERS is out of date)."""
    for item in items:
        for fixture, group in SHARED_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()) and xdist_group(item.nodeid) != group:
                raise pytest.UsageError(f"tests/conftest.py: {item.nodeid} uses the {fixture!r} fixture: add it to FIXTURE_USERS as {group!r}")


def make_scheduler(config, log):
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        """Each group is one unit of work; every other test is a unit of its own."""

        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return Grouped(config, log)


try:
    import xdist  # noqa: F401 - the `test` extra pins it
except ImportError:
    pass
else:
    pytest_xdist_make_scheduler = make_scheduler
