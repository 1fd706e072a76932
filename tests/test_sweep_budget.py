"""A sweep's budget (``sweep.max_usd`` / ``sweep.max_tokens``): a cell starts only while the sweep's spend, the
running cells' caps and its own cap fit; the cells it does not start are no fault, logged nowhere, and a rerun with
a raised budget runs them without running the others again. A budget a cell has no cap for is refused at plan time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

import kbsweep
from kbsweep import KbsweepError
from kbsweep.launch.budget import Ledger, spend_of
from kbsweep.launch.workers import infra_result
from kbsweep.outcomes import Outcome
from kbsweep.planner.budget import SweepBudget
from tests.support.sweeps import REPO, cell_runs

CAP = 1000  # track.max_tokens: what each running cell reserves
CELLS = 6
# the `instant` model reads the reference and submits: two scripted turns, a few hundred tokens, no grade
SWEEP = [
    "track=instant",
    "model=instant",
    "gpu=cpu",
    "problem=scale_shift",
    f"repeat={','.join(map(str, range(CELLS)))}",
    f"track.max_tokens={CAP}",
]


def cli(outputs: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KBSWEEP_OUTPUTS": str(outputs), "KBSWEEP_LOCK_DIR": str(outputs / "locks")}
    return subprocess.run(
        [sys.executable, "-m", "kbsweep.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def journals(outputs: Path) -> Dict[str, Dict[str, Any]]:
    """Cell key -> its result.json."""
    return {
        path.parent.name: json.loads(path.read_text())
        for path in (outputs / "sweeps" / "instant").glob("*/result.json")
    }


def sweep_runs(outputs: Path) -> int:
    from kbsweep.tracking.mlflow_store import make_client

    client = make_client(f"sqlite:///{outputs}/mlflow.db")
    return len(
        client.search_runs([client.get_experiment_by_name("instant").experiment_id], "tags.`kbsweep.kind` = 'sweep'")
    )


def tokens(results: Dict[str, Dict[str, Any]]) -> float:
    return sum(spend_of(result)["tokens"] for result in results.values())


def test_the_budget_stops_starting_cells_and_a_raised_one_runs_the_rest(tmp_path, monkeypatch, capfd):
    outputs = tmp_path / "outputs"
    budget = 3500
    first = cli(outputs, "-m", *SWEEP, f"sweep.max_tokens={budget}", "launcher=local")  # two warm workers
    assert first.returncode == 0, first.stderr
    ran = journals(outputs)
    per_cell = {spend_of(result)["tokens"] for result in ran.values()}
    assert len(per_cell) == 1 and 0 < min(per_cell) <= CAP  # scripted: every cell spends the same, within its cap
    # a cell starts while spent + caps in flight + its cap fit; the sweep stops once, with none running, the next cannot
    expected = 1 + int((budget - CAP) // min(per_cell))
    assert 0 < expected < CELLS  # the budget stops this sweep
    assert len(ran) == expected and all(result["outcome"] == "no_solution" for result in ran.values())
    assert tokens(ran) <= budget
    held = CELLS - expected
    line = (
        f"sweep budget: {tokens(ran):,.0f} tokens spent of {budget:,} tokens, the next cell's cap {CAP:,} tokens; "
        f"{held} cells not started (raise sweep.max_tokens to continue)"
    )
    assert first.stderr.count(line) == 1, first.stderr
    assert "not finished" not in first.stderr  # no infrastructure fault
    runs = cell_runs(outputs, "instant")
    assert len(runs) == expected and {run.info.status for run in runs} == {
        "FINISHED"
    }  # the cells not started are logged nowhere

    # the same budget again: nothing fits, nothing starts, no sweep run is logged
    monkeypatch.setenv("KBSWEEP_OUTPUTS", str(outputs))
    monkeypatch.setenv("KBSWEEP_LOCK_DIR", str(outputs / "locks"))
    capfd.readouterr()
    again = kbsweep.run(*SWEEP, f"sweep.max_tokens={budget}", "launcher=inline")
    assert again.unfinished == [] and again.exit_code == 0
    assert (
        sorted(again.not_started) == sorted({c.key for c in again.cells} - set(ran)) and len(again.not_started) == held
    )
    assert journals(outputs) == ran
    assert capfd.readouterr().err.count(line) == 1
    assert len(cell_runs(outputs, "instant")) == expected and sweep_runs(outputs) == 1

    # a raised budget runs the rest; the finished cells are not run again
    raised = budget + held * CAP
    last = kbsweep.run(*SWEEP, f"sweep.max_tokens={raised}", "launcher=inline")
    assert last.unfinished == [] and last.not_started == []
    after = journals(outputs)
    assert len(after) == CELLS and {key: after[key] for key in ran} == ran
    assert tokens(after) <= raised
    assert len(cell_runs(outputs, "instant")) == CELLS


@pytest.mark.fast
def test_a_job_that_left_no_record_counts_at_its_caps_and_the_progress_line_shows_the_budget(tmp_path):
    from rich.console import Console

    from kbsweep.launch.sweep import Progress
    from tests.test_tracking import make_cell

    cells = [make_cell(tmp_path, repeat=r) for r in range(3)]
    for cell in cells:
        cell.track = {**cell.track, "max_tokens": CAP}
    ledger = Ledger(SweepBudget({"tokens": 2.5 * CAP}))
    assert ledger.admit(cells[0]) and ledger.admit(cells[1])
    assert not ledger.admit(cells[2])  # two caps in flight leave half a cap
    ledger.ended(cells[0], infra_result(cells[0], Outcome.NODE_FAILURE, "killed"))  # its spend unknown: its whole cap
    assert ledger.spent == {"tokens": CAP} and not ledger.admit(cells[2])
    ledger.ended(cells[1], {"outcome": "pass", "started": 1.0, "usage": {"input_tokens": 100, "output_tokens": 20}})
    assert ledger.spent == {"tokens": CAP + 120} and ledger.admit(cells[2])
    progress = Progress(3, console=Console(stderr=True, force_terminal=False), budget=ledger.status)
    assert progress.line().endswith(
        f"; sweep budget: {CAP + 120:,} tokens spent + {CAP:,} tokens in flight of {2.5 * CAP:,.0f} tokens"
    )


@pytest.mark.fast
def test_the_budget_lines_show_what_is_in_flight_only_while_a_cell_reserves_some(tmp_path):
    from tests.test_tracking import make_cell

    cells = [make_cell(tmp_path, repeat=r) for r in range(2)]
    for cell in cells:
        cell.track = {**cell.track, "max_tokens": CAP}
    ledger = Ledger(SweepBudget({"tokens": 1.5 * CAP}))
    assert ledger.status() == "; sweep budget: 0 tokens spent of 1,500 tokens"
    assert ledger.admit(cells[0]) and not ledger.admit(cells[1])
    assert ledger.status() == f"; sweep budget: 0 tokens spent + {CAP:,} tokens in flight of 1,500 tokens"
    ledger.ended(cells[0], {"outcome": "pass", "started": 1.0, "usage": {"input_tokens": 100, "output_tokens": 20}})
    assert ledger.status() == "; sweep budget: 120 tokens spent of 1,500 tokens"
    assert ledger.hold(cells) == (
        f"sweep budget: 120 tokens spent of 1,500 tokens, the next cell's cap {CAP:,} tokens; 1 cells not started "
        "(raise sweep.max_tokens to continue)"
    )


@pytest.mark.fast
def test_a_budget_without_a_cap_per_cell_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("KBSWEEP_OUTPUTS", str(tmp_path / "outputs"))
    for verb in (kbsweep.plan, kbsweep.run):
        with pytest.raises(
            KbsweepError,
            match=r"^track/instant\.yaml: key 'max_usd': not set, and sweep\.max_usd=2\.5 needs a cap per cell",
        ):
            verb("track=instant", "model=instant", "gpu=cpu", "problem=scale_shift", "sweep.max_usd=2.5")
    assert not (tmp_path / "outputs").exists()  # nothing launched, nothing logged
    with pytest.raises(KbsweepError, match=r"conf/config\.yaml: key 'sweep\.max_tokens': must be an integer >= 1"):
        kbsweep.plan("track=instant", "model=instant", "gpu=cpu", "sweep.max_tokens=0")


@pytest.mark.fast
def test_the_plan_shows_the_budget_and_the_worst_case():
    plan = kbsweep.plan(*SWEEP, "sweep.max_tokens=3500", "track.max_usd=0.5", "sweep.max_usd=10")
    assert plan.budget == {
        "limits": {"usd": 10.0, "tokens": 3500.0},
        "worst_case": {"usd": 0.5 * CELLS, "tokens": CAP * CELLS},
        "may_stop": True,
    }
    assert kbsweep.plan(*SWEEP, f"sweep.max_tokens={CAP * CELLS}").budget["may_stop"] is False
    assert kbsweep.plan(*SWEEP).budget is None


def test_kbsweep_plan_prints_the_budget(tmp_path):
    shown = cli(tmp_path, "plan", "-m", *SWEEP, "sweep.max_tokens=3500")
    assert shown.returncode == 0, shown.stderr
    assert re.search(
        rf"^sweep budget: 3,500 tokens \(sweep.max_tokens\), worst case {CAP * CELLS:,} tokens .*: the budget may stop it",
        shown.stdout,
        re.M,
    )
