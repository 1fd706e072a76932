"""A cell whose agent ended cleanly but whose final grade was lost to the infrastructure (a node failure) is graded
again on its next run from the work its agent left, and the model is not run, nor paid, twice; a workspace changed
since, or ``--force``, redoes the cell whole."""

from __future__ import annotations

import json

import pytest

import kbsweep.cell as cell_stage
from kbsweep.cell import AGENT_FILE, clear_for_rerun, run_cell
from kbsweep.launch import sweep
from kbsweep.planner.matrix import cell_dir
from kbsweep.tracking.mlflow_store import runs_frame
from tests.test_tracking import make_cell

LOST = "node_failure"


@pytest.fixture
def first_final_lost(monkeypatch):
    """The real grader, but the first final grade of the process ends as a node failure (its real grade's figures
    kept, as a grade the node failed late would have them); returns the final grades' count."""
    real = cell_stage.grader_for
    finals = []

    def grader_for(*args):
        run = real(*args)

        def graded(mode, solution, log_name):
            result = run(mode, solution, log_name)
            if log_name == "final":
                finals.append(result["outcome"])
                if len(finals) == 1:
                    return {**result, "outcome": LOST, "message": "the node failed the grade", "score": None}
            return result

        return graded

    monkeypatch.setattr(cell_stage, "grader_for", grader_for)
    return finals


def agent_runs(monkeypatch):
    """Counts the cell's agent runs (the real agent still runs)."""
    real, runs = cell_stage.run_agent, []
    monkeypatch.setattr(cell_stage, "run_agent", lambda *args: (runs.append(1), real(*args))[1])
    return runs


def test_the_sweeps_next_run_grades_the_kept_work_and_logs_it(store, monkeypatch, first_final_lost):
    """Through the sweep: its first run logs the lost grade as an infra run; its next run grades the agent's work
    again (no agent run) and logs the cell finished, with the first agent's tokens and turns."""
    outputs, uri = store
    cell = make_cell(outputs)
    runs = agent_runs(monkeypatch)
    tracking = {"uri": uri, "artifact_root": str(outputs / "mlartifacts"), "trace_spans": "artifact"}
    folder = cell_dir(cell)
    assert sweep.run_sweep([cell], tracking, {"kind": "inline"}, force=False) == [cell]
    first = json.loads((folder / "result.json").read_text())
    assert first["outcome"] == LOST and (folder / AGENT_FILE).is_file() and runs == [1]
    transcript = (folder / "transcript.jsonl").read_text()

    assert sweep.run_sweep([cell], tracking, {"kind": "inline"}, force=False) == []
    assert runs == [1], "the agent ran again"
    second = json.loads((folder / "result.json").read_text())
    assert second["outcome"] == "pass" and second["score"] > 0 and first_final_lost == ["pass", "pass"]
    for key in ("usage", "agent_cost_usd", "turns", "steps", "stop_reason", "agent_s"):
        assert second[key] == first[key], key
    assert (folder / "transcript.jsonl").read_text() == transcript
    assert json.loads((folder / "grade.json").read_text())["outcome"] == "pass"
    rows = {row["status"]: row for row in runs_frame(uri) if row["cell_key"] == cell.key}
    lost, done = rows["FAILED"], rows["FINISHED"]
    assert (lost["outcome"], done["outcome"]) == (LOST, "pass")
    assert done["tokens_input"] == lost["tokens_input"] > 0 and done["turns"] == lost["turns"]

    clear_for_rerun(cell, keep=False)  # --force: nothing of the cell is kept
    assert not folder.exists()


def test_a_workspace_changed_since_the_agent_ended_redoes_the_cell_whole(outputs, monkeypatch, first_final_lost):
    cell = make_cell(outputs)
    runs = agent_runs(monkeypatch)
    assert run_cell(cell)["outcome"] == LOST
    folder = cell_dir(cell)
    lines = (folder / "transcript.jsonl").read_text().count("\n")
    with open(folder / "workspace" / "solution.py", "a") as solution:
        solution.write("\n# changed after the agent ended\n")

    clear_for_rerun(cell)
    again = run_cell(cell)
    assert runs == [1, 1] and again["outcome"] == "pass"
    assert (folder / "transcript.jsonl").read_text().count("\n") == lines  # a fresh transcript, not one appended to
    assert "changed after the agent ended" not in (folder / "workspace" / "solution.py").read_text()


def test_an_unreadable_workspace_is_not_kept_and_the_cell_still_ends(outputs, monkeypatch):
    """A workspace the cell cannot read whole (a file its agent made unreadable, say) records no agent: the cell
    ends as it would have, and its rerun would redo it."""

    def unreadable(workspace):
        raise PermissionError(f"{workspace}/x")

    monkeypatch.setattr(cell_stage, "workspace_digest", unreadable)
    cell = make_cell(outputs)
    assert run_cell(cell)["outcome"] == "pass"
    assert not (cell_dir(cell) / AGENT_FILE).exists()


def test_a_run_whose_agent_faulted_keeps_nothing(outputs):
    """Without an agent record (its agent faulted, or never ended), the next run starts from an empty folder."""
    cell = make_cell(outputs)
    folder = cell_dir(cell)
    (folder / "workspace").mkdir(parents=True)
    (folder / "transcript.jsonl").write_text("{}\n")
    clear_for_rerun(cell)
    assert not folder.exists()
