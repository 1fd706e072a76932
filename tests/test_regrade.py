"""`kbsweep regrade`: a sweep's stored final solutions graded again (real MLflow store, real sandboxed grades on
CPU), logged as regrade runs beside the cell runs, shown old and new side by side in the report, skipped once done."""

from __future__ import annotations

import json
import shutil

import pytest

from kbsweep.planner.matrix import cell_dir
from kbsweep.tracking.cell_result import CellResult
from kbsweep.tracking.mlflow_store import runs_frame
from kbsweep.tracking.tracker import Tracker
from tests.test_report import REPO, cli
from tests.test_tracking import make_cell, write_result

QUICK = ["grade.timing.min_runs=2", "grade.timing.max_runs=4", "grade.timing.max_time_s=0.5"]


def test_regrade_grades_stored_solutions_beside_the_old_records(store):
    outputs, uri = store
    tracker = Tracker(uri, str(outputs / "mlartifacts"), "demo")
    tracker.start_sweep({"launcher": "inline"}, 2)
    solutions = {"scale_shift": "triton", "row_softmax": None}  # a cell that ended without a solution is skipped
    cell_runs = {}
    for problem, solution in solutions.items():
        cell = make_cell(outputs, problem=problem)
        run_id, result = tracker.start_cell(cell), write_result(cell, score=0.4)
        if solution:
            shutil.copy(REPO / f"problems/demo/{problem}/solutions/{solution}.py", cell_dir(cell) / "solution.py")
        else:
            (cell_dir(cell) / "solution.py").unlink()
        cell_runs[problem] = tracker.finish_cell(run_id, CellResult.from_json(result))
    tracker.end_sweep("FINISHED", {})

    proc = cli(outputs, "regrade", "gpu=cpu", "sweep.name=demo", *QUICK)
    assert proc.returncode == 0, proc.stderr
    assert "1 solutions of sweep 'demo' regraded on cpu" in proc.stderr
    [regrade] = runs_frame(uri, ["demo"], kind="regrade")
    assert (
        regrade["kbsweep.regrade_of"] == cell_runs["scale_shift"]
        and regrade["outcome"] == "pass"
        and regrade["gpu"] == "cpu"
    )
    assert regrade["score"] > 0 and {r["run_id"] for r in runs_frame(uri, ["demo"])} == set(
        cell_runs.values()
    )  # boards unchanged
    grade = json.loads((outputs / "regrades/demo/cpu" / regrade["cell_key"] / "grade.json").read_text())
    assert grade["outcome"] == "pass" and grade["timings"]
    assert (
        "regrades — demo / cpu" in proc.stdout and "pass 0.4 (cpu)" in proc.stdout
    )  # the sweep's score beside the new one
    report = json.loads((outputs / "reports/report.json").read_text())["boards"][0]["regrades"]
    assert [(r["run_id"], r["old_score"], r["score"]) for r in report] == [
        (cell_runs["scale_shift"], 0.4, regrade["score"])
    ]

    again = cli(outputs, "regrade", "gpu=cpu", "sweep.name=demo", *QUICK)  # done already: nothing graded
    assert again.returncode == 0 and "0 solutions of sweep 'demo' regraded" in again.stderr
    assert len(runs_frame(uri, ["demo"], kind="regrade")) == 1


@pytest.mark.fast
def test_a_cell_counts_as_regraded_by_its_finished_regrade_on_that_gpu():
    """What a rerun skips (kbsweep/launch/regrade.py): cells with a FINISHED regrade run on the GPU; a failed one is redone."""
    from types import SimpleNamespace

    from kbsweep.launch.regrade import REGRADE_OF, regraded

    def run(of, run_id, status):
        return SimpleNamespace(
            data=SimpleNamespace(tags={REGRADE_OF: of}), info=SimpleNamespace(run_id=run_id, status=status)
        )

    class Page(list):
        token = None

    class Client:
        def search_runs(self, experiment_ids, filter_string, max_results, page_token):
            self.filter = filter_string
            return Page([run("cell-a", "regrade-1", "FINISHED"), run("cell-b", "regrade-2", "FAILED")])

    client = Client()
    assert regraded(client, "1", "h200") == {"cell-a": "regrade-1"}
    assert "tags.gpu = 'h200'" in client.filter and "'regrade'" in client.filter
