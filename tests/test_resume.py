"""Resume: a rerun skips finished cells, logs unlogged journals from disk, redoes infra and unfinished cells;
a sweep killed with SIGKILL loses no finished cell and grades none twice; one stopped with Ctrl-C says so in
one line and leaves no run open."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from kbsweep import KbsweepError
from kbsweep.launch import sweep
from kbsweep.launch.launchers import Launcher
from kbsweep.outcomes import Outcome
from kbsweep.planner.matrix import cell_dir
from kbsweep.tracking import tracker as tracking
from kbsweep.tracking.mlflow_store import latest_per_cell, make_client, page_runs, runs_frame
from kbsweep.tracking.snapshot import load as load_snapshot
from kbsweep.tracking.tracker import Tracker
from tests.test_tracking import dead_pid, make_cell, write_result

REPO = Path(__file__).resolve().parent.parent


class Crash(Exception):
    """Stands in for a SIGKILL between a cell's journal and its tracking record."""


class FakeLauncher(Launcher):
    """Writes each cell's result.json as run_cell would; optionally dies right after writing cell number ``crash_after``."""

    def __init__(self, ran: List[str], crash_after: int | None = None, outcome: str = "pass"):
        super().__init__({"kind": "fake"})
        self.ran, self.crash_after, self.outcome = ran, crash_after, outcome

    def run(self, cells, on_start, on_done):
        for i, cell in enumerate(cells, 1):
            on_start(cell)
            self.ran.append(cell.key)
            result = write_result(cell, outcome=self.outcome)
            if i == self.crash_after:
                raise Crash
            on_done(cell, result)


@pytest.fixture
def env(store, monkeypatch):
    """Three demo cells, an sqlite store and a launcher factory whose cells are recorded in ``ran``."""
    outputs, uri = store
    cells = [make_cell(outputs, repeat=r) for r in range(3)]
    conf = {"uri": uri, "artifact_root": str(outputs / "mlartifacts"), "trace_spans": "artifact"}
    ran: List[str] = []
    launcher = {"factory": lambda: FakeLauncher(ran)}
    monkeypatch.setattr(sweep, "make_launcher", lambda _conf: launcher["factory"]())
    return cells, conf, ran, launcher


def finished_runs(conf) -> dict:
    """cell key → number of FINISHED cell runs."""
    counts: dict = {}
    for row in runs_frame(conf["uri"]):
        if row["status"] == "FINISHED":
            counts[row["cell_key"]] = counts.get(row["cell_key"], 0) + 1
    return counts


def test_rerun_after_a_crash_logs_the_journal_from_disk_and_runs_only_the_rest(env, monkeypatch, capfd):
    cells, conf, ran, launcher = env
    monkeypatch.setattr(
        tracking, "owner", lambda: f"{socket.gethostname()}:{dead_pid()}"
    )  # the crashed process is gone
    launcher["factory"] = lambda: FakeLauncher(ran, crash_after=2)
    with pytest.raises(Crash):
        sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False)
    assert ran == [cells[0].key, cells[1].key]
    assert finished_runs(conf) == {cells[0].key: 1}  # cell 2's journal is on disk, its run was left RUNNING
    monkeypatch.undo()
    monkeypatch.setattr(sweep, "make_launcher", lambda _conf: FakeLauncher(ran))
    journal = (cell_dir(cells[1]) / "result.json").read_text()

    sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False)
    assert ran == [cells[0].key, cells[1].key, cells[2].key]  # cell 2 was not run again
    assert (cell_dir(cells[1]) / "result.json").read_text() == journal
    assert finished_runs(conf) == {c.key: 1 for c in cells}
    err = capfd.readouterr().err
    assert "1 already finished, 1 to log from disk, 1 to run (1 stale runs closed)" in err
    statuses = sorted(row["status"] for row in runs_frame(conf["uri"]))
    assert statuses == ["FINISHED"] * 3 + ["KILLED"]


def test_infra_and_unfinished_cells_are_redone_from_an_empty_folder(env):
    """An infra journal that was never logged is logged (as a failed run) before the cell is redone."""
    cells, conf, ran, _ = env
    write_result(cells[0], outcome="provider_error", score=0.0)  # infra: retried
    (cell_dir(cells[1]) / "workspace").mkdir(parents=True)
    (cell_dir(cells[1]) / "transcript.jsonl").write_text('{"type": "user"}\n')  # killed mid-cell: no journal
    sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False)
    assert ran == [c.key for c in cells]
    rows = runs_frame(conf["uri"])
    assert sorted((r["status"], r["outcome"]) for r in rows if r["cell_key"] == cells[0].key) == [
        ("FAILED", "provider_error"),
        ("FINISHED", "pass"),
    ]
    lines = (cell_dir(cells[1]) / "transcript.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["type"] == "system"  # the half transcript was cleared, not appended to
    assert not (cell_dir(cells[1]) / "workspace").exists()


def test_infra_outcomes_are_rerun_by_the_next_invocation(env):
    cells, conf, ran, launcher = env
    launcher["factory"] = lambda: FakeLauncher(ran, outcome="rate_limited")
    sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False)
    launcher["factory"] = lambda: FakeLauncher(ran)
    sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False)
    sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False)  # nothing left to do
    assert ran == [c.key for c in cells] * 2
    assert finished_runs(conf) == {c.key: 1 for c in cells}
    assert (
        sorted(r["status"] for r in runs_frame(conf["uri"])) == ["FAILED"] * 3 + ["FINISHED"] * 3
    )  # each infra result logged once


def test_force_redoes_every_cell_and_the_latest_record_counts(env):
    cells, conf, ran, _ = env
    sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False)
    sweep.run_sweep(cells, conf, {"kind": "fake"}, force=True)
    assert ran == [c.key for c in cells] * 2
    rows = runs_frame(conf["uri"])
    assert finished_runs(conf) == {c.key: 2 for c in cells}
    latest = latest_per_cell(rows)
    assert len(latest) == 3 and all(
        r["start_time"] == max(x["start_time"] for x in rows if x["cell_key"] == r["cell_key"]) for r in latest
    )


def test_a_tracking_failure_keeps_the_sweep_going_and_the_next_run_logs_it(env, monkeypatch, capfd):
    cells, conf, ran, _ = env
    real = Tracker.finish_cell

    def flaky(self, run_id, result, *live):
        if result.key == cells[1].key:
            raise ConnectionError("tracking server went away")
        return real(self, run_id, result, *live)

    monkeypatch.setattr(Tracker, "finish_cell", flaky)
    sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False)
    assert "1 results are on disk but not in tracking" in capfd.readouterr().err
    assert set(finished_runs(conf)) == {cells[0].key, cells[2].key}
    monkeypatch.setattr(Tracker, "finish_cell", real)
    sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False)
    assert ran == [c.key for c in cells]  # logged from its journal, not run again
    assert finished_runs(conf) == {c.key: 1 for c in cells}


def test_a_second_orchestrator_of_the_same_sweep_is_refused(env):
    cells, conf, ran, _ = env
    with sweep.sweep_lock(Path(cells[0].paths["outputs"]), cells[0].sweep):
        with pytest.raises(KbsweepError, match="already running from"):
            sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False)
    assert ran == []


@pytest.mark.fast
def test_progress_bar_on_a_terminal_and_lines_otherwise(capsys):
    from rich.console import Console

    screen = io.StringIO()
    with sweep.Progress(3, console=Console(file=screen, force_terminal=True, width=120)) as progress:
        progress.done, progress.running, progress.usd = 2, 1, 0.5
        progress.outcomes.update([Outcome.RATE_LIMITED, Outcome.PASS])
        progress.show("cell x: pass")
    assert "2/3" in screen.getvalue() and "1 running, 1 pass, 1 rate_limited (infra), $0.50 spent" in screen.getvalue()
    assert "cell x: pass" in screen.getvalue() and progress.infra == 1
    with sweep.Progress(3, console=Console(file=io.StringIO(), force_terminal=False)) as progress:
        progress.done = 1
        progress.show("cell y")
    assert capsys.readouterr().err == "[kbsweep] 1/3 done, 0 running, $0.00 spent  cell y\n"


def test_the_progress_line_counts_the_ended_cells_by_outcome(tmp_path):
    """A model's failures are no infrastructure fault, and no cell is left out of the count: each outcome by name."""
    _, err = kbsweep(tmp_path / "outputs", "model=scripted-lazy,instant", "track=instant").communicate(timeout=600)
    lines = [line for line in err.splitlines() if " done, " in line]
    assert lines[-1].startswith("[kbsweep] 4/4 done, 0 running, 2 incorrect, 2 no_solution, $0.00 spent"), err
    assert not any("failed" in line for line in lines)


def kbsweep(outputs: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "KBSWEEP_OUTPUTS": str(outputs), "KBSWEEP_LOCK_DIR": str(outputs / "locks")}
    command = [
        sys.executable,
        "-m",
        "kbsweep.cli",
        "-m",
        "launcher=inline",
        "gpu=cpu",
        "problem=scale_shift",
        "repeat=0,1",
        *args,
    ]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def snapshot(folder: Path) -> dict:
    """Every file under a cell folder with its modification time and size."""
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*") if p.is_file()
    }


def test_sigkill_mid_sweep_loses_no_finished_cell_and_grades_none_twice(tmp_path):
    outputs = tmp_path / "outputs"
    proc = kbsweep(outputs)
    sweeps = outputs / "sweeps" / "demo"
    deadline = time.monotonic() + 300
    while not list(sweeps.glob("*/result.json")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no cell finished in time"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the orchestrator and the grade it may be running, at once
    proc.wait()
    [first] = [p.parent for p in sweeps.glob("*/result.json")]
    before = snapshot(first)
    assert any(name.startswith("grades/") for name in before)

    rerun = kbsweep(outputs)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    assert (
        "2 cells, 1 already finished, 0 to log from disk, 1 to run" in err
        or "2 cells, 0 already finished, 1 to log from disk, 1 to run" in err
    ), err
    assert snapshot(first) == before  # same journal, same grade logs: nothing regraded, nothing rewritten
    results = [json.loads(p.read_text()) for p in sweeps.glob("*/result.json")]
    assert sorted(r["outcome"] for r in results) == ["pass", "pass"]
    uri = f"sqlite:///{outputs}/mlflow.db"
    finished = [r for r in runs_frame(uri) if r["status"] == "FINISHED"]
    assert sorted(r["cell_key"] for r in finished) == sorted(r["key"] for r in results)  # one record per cell
    assert "kbsweep leaderboard — demo / cpu" in out


def test_ctrl_c_mid_sweep_stops_in_one_line_and_leaves_no_run_open(tmp_path):
    """Ctrl-C reaches the whole foreground process group, as a terminal sends it: the sweep says in one line what
    finished and what was stopped, exits 130 without a traceback, closes the stopped cells' runs, leaves nothing in
    the system's temporary folder (here a folder of the test's own, TMPDIR), and the same command then runs only
    what is left."""
    outputs, system_tmp = tmp_path / "outputs", tmp_path / "system-tmp"
    system_tmp.mkdir()
    env = {
        **os.environ,
        "KBSWEEP_OUTPUTS": str(outputs),
        "KBSWEEP_LOCK_DIR": str(outputs / "locks"),
        "TMPDIR": str(system_tmp),
    }
    command = [
        sys.executable,
        "-m",
        "kbsweep.cli",
        "-m",
        "gpu=cpu",
        "preflight=off",
        "problem=scale_shift",
        "repeat=range(0,4)",
    ]
    # as from a terminal: a shell without job control (CI's, say) starts background commands with SIGINT ignored,
    # and Python then leaves it ignored
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    uri, deadline = f"sqlite:///{outputs}/mlflow.db", time.monotonic() + 300
    while not (outputs / "mlflow.db").exists() or "FINISHED" not in [
        row["status"] for row in runs_frame(uri) if row["cell_key"]
    ]:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no cell was logged in time"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # one cell logged, others running
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.rstrip().endswith("kbsweep: interrupted"), err
    [line] = [line for line in err.splitlines() if line.startswith("[kbsweep] interrupted: ")]
    done, stopped = map(
        int,
        re.fullmatch(
            r"\[kbsweep\] interrupted: (\d+) of 4 cells finished and logged, (\d+) stopped; .*", line
        ).groups(),
    )
    assert done >= 1 and stopped >= 1, line
    cell_runs = [row["status"] for row in runs_frame(uri) if row["cell_key"]]
    assert sorted(cell_runs) == ["FINISHED"] * done + ["KILLED"] * stopped, cell_runs
    time.sleep(2)  # the stopped cells' process trees, ended before the orchestrator exits, are gone by now
    assert sorted(p.name for p in system_tmp.iterdir()) == []  # the grading zygotes' homes and logs are under outputs/

    rerun = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    # a stopped cell whose journal landed as its sweep stopped is logged from disk, not run again
    assert re.search(rf"4 cells, {done} already finished, \d+ to log from disk, \d+ to run\n", rerun.stderr), (
        rerun.stderr
    )
    cell_runs = [row for row in runs_frame(uri) if row["cell_key"]]
    assert len({row["cell_key"] for row in cell_runs if row["status"] == "FINISHED"}) == 4


def test_a_finished_sweep_resumes_from_its_snapshot_until_the_store_changes(env, monkeypatch, capfd):
    cells, conf, ran, _ = env
    assert sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False) == []

    def parents():
        return len(
            page_runs(
                make_client(conf["uri"]),
                [Tracker(conf["uri"], "", "demo").experiment_id],
                "tags.`kbsweep.kind` = 'sweep'",
            )
        )

    before = parents()
    with monkeypatch.context() as patched:  # everything finished and the store untouched: MLflow is not consulted
        patched.setattr(sweep, "Tracker", lambda *a: pytest.fail("the tracking store was opened"))
        assert sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False) == []
    assert "3 cells, 3 already finished, 0 to log from disk, 0 to run" in capfd.readouterr().err
    Tracker(conf["uri"], "", "other").start_sweep({}, 0)  # any write to the store: the snapshot no longer holds
    assert load_snapshot(sweep.history_path(cells[0]), conf["uri"]) is None
    assert sweep.run_sweep(cells, conf, {"kind": "fake"}, force=False) == [] and ran == [c.key for c in cells]
    assert parents() == before  # an invocation with nothing to do leaves no empty parent run
