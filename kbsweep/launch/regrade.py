"""``kbsweep regrade``: a sweep's stored final solutions graded again, on another GPU or after a grader change.

Each cell's latest finished run that kept a ``solution.py`` is graded in full under the composed config's GPU,
track limits and grade settings, one grade at a time and one regrade per GPU at a time (:func:`kbsweep.grader.locks
.exclusive`, beside the per-grade GPU lock). Each grade is a new run of the sweep's experiment, tagged
``kbsweep.kind=regrade`` and ``kbsweep.regrade_of=<the cell's run>``: the boards keep ranking the cell runs, and
the report sets the new scores beside the old ones. The cell's audit verdict is not redone (``kbsweep audit``
does that). A cell already regraded on this GPU is skipped unless ``--force``. Also the audit ``kbsweep grade`` gives the file it
grades (:func:`audit_file`, as a cell's solution is audited) and its line on stderr.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, List

from kbsweep import audit as audit_stage
from kbsweep.errors import KbsweepError
from kbsweep.grader.locks import exclusive
from kbsweep.outcomes import Outcome
from kbsweep.tracking.mlflow_store import CELL_KEY_TAG, KIND_TAG, latest_per_cell, page_runs, runs_frame
from kbsweep.tracking.tracker import Tracker, cell_metrics, owner

REGRADE_OF = "kbsweep.regrade_of"


def regraded(client, experiment_id: str, gpu: str) -> Dict[str, str]:
    """Cell run id → its finished regrade's run id, on ``gpu``."""
    runs = page_runs(client, [experiment_id], f"tags.`{KIND_TAG}` = 'regrade' and tags.gpu = '{gpu}'")
    return {r.data.tags[REGRADE_OF]: r.info.run_id for r in runs if r.info.status == "FINISHED"}


def regrade_sweep(conf: Dict[str, Any], force: bool) -> List[Dict[str, Any]]:
    """Regrade the cells of ``conf['sweep']['name']`` under ``conf`` (a resolved config); one summary per grade."""
    from kbsweep.config.gpus import GpuSpec, require_card
    from kbsweep.score.roofline import load_roofline

    uri, sweep, gpu, track = conf["tracking"]["uri"], conf["sweep"]["name"], GpuSpec(**conf["gpu"]), conf["track"]
    require_card(gpu)  # before the store is read: on a machine without the card, that is the fault to name
    cells = [r for r in latest_per_cell(runs_frame(uri, [sweep])) if r.get("track") == track["name"]]
    if not cells:
        raise KbsweepError(f"sweep.name={sweep}: no finished cell of track '{track['name']}' in {uri}")
    tracker = Tracker(uri, conf["tracking"]["artifact_root"], sweep, conf["tracking"]["trace_spans"])
    client = tracker.client
    done = {} if force else regraded(client, tracker.experiment_id, gpu.name)
    roofline = load_roofline(conf["paths"]["roofline_specs"], gpu.roofline)
    summaries = []
    with exclusive(f"regrade-{gpu.name}"):
        for row in cells:
            if row["run_id"] in done:
                continue
            folder = Path(conf["paths"]["outputs"]) / "regrades" / sweep / gpu.name / row["cell_key"]
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            if "solution.py" not in {a.path for a in client.list_artifacts(row["run_id"])}:
                continue  # the cell ended without a solution: nothing to grade
            solution = Path(client.download_artifacts(row["run_id"], "solution.py", str(folder)))
            result = grade_file(conf, str(row["problem"]), solution, folder, gpu, roofline)
            summaries.append(log_regrade(tracker, row, gpu.name, result, folder))
            print(
                f"[kbsweep] regraded {row.get('model')} · {row['problem']} · r{row.get('repeat')}: {row.get('gpu')} "
                f"{row.get('score')} -> {gpu.name} {result['outcome']} {result.get('score')}",
                file=sys.stderr,
                flush=True,
            )
    return summaries


def load_track_problem(conf: Dict[str, Any], problem_id: str):
    """The Problem ``<track>/<name>`` of the composed track, from this checkout's problem roots."""
    from kbsweep.config.problem_folders import find_problem_dir
    from kbsweep.config.problems import load_problem

    track, name = conf["track"], problem_id.split("/", 1)[-1]
    return load_problem(
        find_problem_dir(
            conf["paths"]["problems"], track["problems_dir"], name, track["format"], track.get("kernelbench_version")
        ),
        track["name"],
    )


def grade_file(conf: Dict[str, Any], problem_id: str, solution: Path, folder: Path, gpu, roofline) -> Dict[str, Any]:
    """One full grade of ``solution`` under ``conf``'s track and grade settings (a regrade's; ``kbsweep verify``'s);
    its result is also written to ``folder/grade.json``."""
    from kbsweep.cell import configured_grader

    problem = load_track_problem(conf, problem_id)
    grade = configured_grader(problem, roofline, folder, gpu, conf["track"], conf["grade"], conf["paths"])
    result = grade("full", solution, "regrade")
    (folder / "grade.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def log_regrade(
    tracker: Tracker, row: Dict[str, Any], gpu: str, result: Dict[str, Any], folder: Path
) -> Dict[str, Any]:
    """The regrade as a run beside the cell's: the cell's labels, the new GPU, outcome, score and timings."""
    tags = {
        KIND_TAG: "regrade",
        REGRADE_OF: row["run_id"],
        CELL_KEY_TAG: row["cell_key"],
        "kbsweep.orchestrator": owner(),
        "gpu": gpu,
        "outcome": result["outcome"],
        **{k: str(row.get(k)) for k in ("track", "problem", "model", "harness", "repeat")},
    }
    run = tracker.client.create_run(tracker.experiment_id, tags=tags, run_name=f"regrade_{row['cell_key']}_{gpu}")
    scored = {**result, "score": result.get("score") if result["outcome"] == Outcome.PASS else None}
    metrics = {
        k: v
        for k, v in cell_metrics(scored).items()
        if k.startswith(("shape", "speedup", "score", "passed", "grade_s"))
    }
    tracker.log_batch(run.info.run_id, metrics=[(k, v, 0) for k, v in metrics.items()])
    tracker.client.log_artifact(run.info.run_id, str(folder / "grade.json"))
    tracker.client.set_terminated(run.info.run_id, "FINISHED")
    return {
        "run_id": run.info.run_id,
        "regrade_of": row["run_id"],
        "outcome": result["outcome"],
        "score": scored["score"],
    }


def audit_line(audited: Any) -> str:
    """What ``kbsweep grade`` says of the audit: the verdict a cell would get and its findings' kinds, or that none was run."""
    if audited is None:
        return "not run (--no-audit): no verdict; a sweep audits a cell's solution before its pass counts"
    kinds = ", ".join(sorted({f["kind"] for f in audited["findings"]}))
    flagged = "" if audited["verdict"] == "clean" else "; a sweep would not count this pass"
    return f"{audited['verdict']}{f' ({kinds})' if kinds else ''}{flagged} (the static and dynamic layers, as a cell's; no judge)"


def audit_file(problem: Any, solution: Path, result: Dict[str, Any]) -> Dict[str, Any]:
    """A cell's audit of its solution over this grade's evidence (no transcript, no judge; a solution.py's helpers)."""
    helpers = (
        audit_stage.workspace_helpers(solution.parent, problem.reference.read_text())
        if solution.name == "solution.py"
        else {}
    )
    return audit_stage.audit(solution.read_text(), problem.spec.forbidden, result, problem=problem, helpers=helpers)
