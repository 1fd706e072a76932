"""One cell, end to end: fresh workspace → agent loop → final grade → audit → score. Runs where the launcher puts it.

The cell's folder holds the workspace, the transcript, the grade logs, ``agent.json`` (the agent's record once it
ended cleanly: a run lost to the infrastructure after it is graded again from that work, :func:`reusable_agent`)
and ``result.json`` (the journal the orchestrator logs to tracking; a result on disk is never recomputed).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
import traceback
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from kbsweep import audit as audit_stage
from kbsweep.agent.loop import AgentResult, Budgets, fault_outcome
from kbsweep.agent.models import Usage
from kbsweep.agent.tools import Toolbox
from kbsweep.agent.transcript import Redactor, Transcript
from kbsweep.audit.judge import LazyModel
from kbsweep.config.gpus import GpuSpec, gpu_mismatch
from kbsweep.config.problems import load_problem
from kbsweep.grader import grade
from kbsweep.grader.locks import device_lock
from kbsweep.grader.processes import prewarm
from kbsweep.grader.request import GradeRequest
from kbsweep.harness import AgentJob, runner_for
from kbsweep.outcomes import Outcome, StopReason
from kbsweep.planner.matrix import Cell, cell_dir
from kbsweep.sandbox.confine import Sandbox, SandboxPolicy
from kbsweep.score.roofline import ShapeScore, load_roofline
from kbsweep.tracking.cell_result import CellResult
from kbsweep.tracking.tracker import owner, owner_alive

PUBLIC_FILES = ("reference.py", "prompt.md")
RESULT_FILE = "result.json"
AGENT_FILE = "agent.json"  # the agent's record once it ended without a fault, and a digest of the workspace it left
FINAL_FILES = (
    RESULT_FILE,
    "result.tmp",
    "grade.json",
    "audit.json",
    "solution.py",
    "harness_error.log",
    "grades/final",
)  # what follows the agent
RECLAIM_WAIT_S = 30.0  # for a killed holder's lock to be released (its grade's sandbox winding down)


def workspace_digest(workspace: Path) -> str:
    """Every path under ``workspace`` with what it holds (a link's target, never what it points to)."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(workspace):
        dirs.sort()
        for name in sorted(dirs + files):
            path = Path(root) / name
            kind = "link" if path.is_symlink() else "file" if path.is_file() else "dir" if path.is_dir() else "other"
            digest.update(f"{kind}\0{path.relative_to(workspace)}\0".encode())
            if kind == "link":
                digest.update(os.readlink(path).encode())
            elif kind == "file":
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(block)
    return digest.hexdigest()


def keep_agent(folder: Path, agent: AgentResult) -> None:
    """Record an agent that ended without a fault, before its work is graded (:func:`reusable_agent`); none where
    its workspace cannot be read whole (the cell then runs as ever, and a rerun redoes it)."""
    try:
        digest = workspace_digest(folder / "workspace")
    except OSError:
        return
    (folder / AGENT_FILE).write_text(json.dumps({"agent": dataclasses.asdict(agent), "workspace": digest}, default=str))


def reusable_agent(folder: Path) -> Optional[AgentResult]:
    """The agent of an earlier run of this cell, when that run ended for the infrastructure after its agent had
    ended cleanly (:func:`clear_for_rerun` kept its work) and the workspace is as the agent left it: its work is
    graded again instead of redone, and the model is not paid for twice. None otherwise."""
    try:
        saved = json.loads((folder / AGENT_FILE).read_text())
        if saved.get("workspace") != workspace_digest(folder / "workspace"):
            return None
    except (OSError, ValueError):
        return None
    agent = saved["agent"]
    return AgentResult(**{**agent, "stop_reason": StopReason(agent["stop_reason"]), "usage": Usage(**agent["usage"])})


def clear_for_rerun(cell: Cell, keep: bool = True) -> None:
    """Ready a cell's folder for its next run: of a run whose agent ended cleanly, what its agent left (its record,
    workspace, transcript and check grades) stays unless ``keep`` is false (``--force``), and only what followed
    the agent goes; otherwise the whole folder."""
    folder = cell_dir(cell)
    if not (keep and (folder / AGENT_FILE).is_file()):
        shutil.rmtree(folder, ignore_errors=True)
        return
    for name in FINAL_FILES:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def prepare_workspace(folder: Path, problem_root: Path) -> Path:
    """A fresh workspace holding the problem's public files only."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name in PUBLIC_FILES:
        if (problem_root / name).exists():
            shutil.copy2(problem_root / name, folder / name)
    return folder


def grader_for(cell: Cell, problem, roofline: Dict[str, Any], folder: Path):
    """A grade function bound to this cell: check/bench/full on the workspace's solution.py."""
    return configured_grader(
        problem, roofline, folder, cell.gpu, cell.track, cell.grade, cell.paths, cell.deck_version, secret_env(cell)
    )


def configured_grader(
    problem,
    roofline: Dict[str, Any],
    folder: Path,
    gpu: GpuSpec,
    track: Dict[str, Any],
    grade_conf: Dict[str, Any],
    paths: Dict[str, Any],
    deck_version: Optional[str] = None,
    hidden: Sequence[str] = (),
):
    """``run(mode, solution, log_name)``: a grade under the configuration's GPU, track limits, timing, baselines
    and baseline cache (:meth:`GradeRequest.from_config`), the same for a sweep's cells and a one-file
    ``kbsweep grade``; its result as stored (JSON)."""
    configured = GradeRequest.from_config(problem, roofline, gpu, track, grade_conf, paths, deck_version, hidden)
    assert configured.sandbox is not None and configured.zygote_home is not None  # from_config sets both
    prewarm(problem, configured.gpu.device, configured.world_size, hidden, configured.sandbox, configured.zygote_home)

    def run(mode: str, solution: Path, log_name: str) -> Dict[str, Any]:
        with device_lock(configured.gpu.device, count=configured.world_size):
            return grade(configured.of(mode, solution, folder / "grades" / log_name)).to_json()

    return run


def final_outcome(agent_fault: Outcome | None, stop: StopReason, graded: Dict[str, Any] | None) -> Outcome:
    """The cell's outcome. A provider fault for good is an infra outcome whatever the solution's state when it hit
    (none, failing or passing): a run cut short is never scored, and the next run of the sweep redoes it. Scoring a
    pass that happened to precede the fault while retrying a failure that did would bias pass rates upward."""
    if agent_fault is not None:
        return agent_fault
    if graded is None:
        budget = stop in (
            StopReason.WALL_CLOCK,
            StopReason.MAX_TURNS,
            StopReason.TOKEN_BUDGET,
            StopReason.DOLLAR_BUDGET,
        )
        return Outcome.BUDGET_EXHAUSTED if budget else Outcome.NO_SOLUTION
    return Outcome(graded["outcome"])


def cell_lock_path(cell: Cell) -> Path:
    """Beside the cell's folder (which a rerun may clear), held for as long as the cell runs."""
    return cell_dir(cell).parent / f"{cell.key}.lock"


def cell_busy(cell: Cell) -> bool:
    """True while some process (an earlier sweep's orphaned job, say) is running this cell."""
    path = cell_lock_path(cell)
    if not path.exists():
        return False
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def reclaim(cell: Cell, wait_s: float = RECLAIM_WAIT_S) -> bool:
    """End the process holding a cell's lock (the orphaned job of a sweep that died: one orchestrator per sweep
    runs at a time, so no live one owns it) and wait for the lock; False if it is still held. A holder on
    another host is reached through its Slurm job, when it names one."""
    from kbsweep.grader.torchrun import kill_tree

    holder = json.loads(cell_lock_path(cell).read_text() or "{}")
    stamp = holder.get("holder") or ""
    if stamp.startswith(f"{socket.gethostname()}:") and owner_alive(stamp):
        kill_tree(int(stamp.split(":")[1]))
    elif holder.get("slurm_job") and shutil.which("scancel"):
        subprocess.run(["scancel", str(holder["slurm_job"])], capture_output=True)
    else:
        return not cell_busy(cell)  # a holder that names itself nowhere is left alone
    deadline = time.monotonic() + wait_s
    while cell_busy(cell):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def run_cell(cell: Cell) -> Dict[str, Any]:
    """Run one cell under its lock (never twice at once) and write its result.json; any harness failure
    becomes a harness_error result. The lock file names its holder (for :func:`reclaim`). Returns the journal as
    stored (:meth:`CellResult.to_json`), what launchers carry to the sweep and tracking logs."""
    path = cell_lock_path(cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.truncate(0)
        handle.write(json.dumps({"holder": owner(), "slurm_job": os.environ.get("SLURM_JOB_ID")}))
        handle.flush()
        return run_cell_locked(cell)


def run_cell_locked(cell: Cell) -> Dict[str, Any]:
    folder = cell_dir(cell)
    journal = folder / RESULT_FILE
    if journal.exists():
        return json.loads(journal.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    started = time.time()
    redactor = cell_redactor(cell)
    try:
        result = work_cell(cell, folder, redactor)
    except Exception as exc:  # the harness's fault, not the model's: retried by the next run
        (folder / "harness_error.log").write_text(redactor.text(traceback.format_exc()))
        result = CellResult(Outcome.HARNESS_ERROR, f"{type(exc).__name__}: {exc}".splitlines()[0])
    result.key, result.cell, result.started, result.finished, result.folder = (
        cell.key,
        cell.label,
        started,
        time.time(),
        str(folder),
    )
    stored = redactor.data(result.to_json())
    tmp = journal.with_suffix(".tmp")
    tmp.write_text(json.dumps(stored, indent=1, default=str))
    tmp.replace(journal)
    return stored


def secret_env(cell: Cell) -> list:
    """The environment variables holding the cell's model keys: the agent's and the judge's."""
    return sorted({conf["api_key_env"] for conf in (cell.model, cell.judge or {}) if conf.get("api_key_env")})


def cell_redactor(cell: Cell) -> Redactor:
    """Redacts the model keys (the agent's, the judge's, and every *_API_KEY/_TOKEN/_SECRET value) from what
    the cell writes; the same names are hidden from run_shell and the grader."""
    return Redactor(secret_env(cell))


def judge_deadline(cell: Cell, started: float) -> float:
    """When the judge must have answered (a ``time.monotonic()`` instant): half the launcher's slack past the agent's
    and the final grade's caps, so the launcher's hard cap never kills a cell over its judge."""
    slack = float((cell.launcher or {}).get("cap_slack_s", 600.0))
    return started + float(cell.track["time_cap_s"]) + float(cell.track["grade_timeout_s"]) + slack / 2


def spend(agent, audited: Dict[str, Any] | None) -> Dict[str, Any]:
    """The cell's dollars and tokens: the agent's, the judge's apart, and the total (``cost_usd``, what sweeps and
    boards add up)."""
    judge = ((audited or {}).get("layers") or {}).get("judge") or {}
    judge_usd = float(judge.get("cost_usd") or 0.0)
    return {
        "usage": vars(agent.usage),
        "cost_usd": agent.cost_usd + judge_usd,
        "agent_cost_usd": agent.cost_usd,
        # None where no judge was asked: no judge_* metrics, rather than zeros that read as a free judge's answer
        "judge_cost_usd": judge_usd if judge else None,
        "judge_usage": judge.get("usage"),
    }


def cell_message(fault: Dict[str, str] | None, graded: Dict[str, Any]) -> Optional[str]:
    """Why the cell is not a plain pass: the provider's fault, with the grade its partial solution had (recorded,
    never scored), else the grader's message."""
    if fault is None:
        return graded.get("message")
    if not graded:
        return fault["message"]
    score = f" (score {graded['score']:.3g})" if graded.get("score") is not None else ""
    return f"{fault['message']}; its solution so far graded {graded['outcome']}{score}, not scored"


def run_agent(cell: Cell, folder: Path, workspace: Path, problem, grade_with, redactor: Redactor) -> AgentResult:
    """The cell's agent on a fresh workspace, recorded (:func:`keep_agent`) when it ends without a fault."""
    counter = iter(range(1, 1_000_000))
    toolbox = Toolbox(
        workspace=workspace,
        grade=lambda mode: grade_with(mode, workspace / "solution.py", f"{mode}-{next(counter)}"),
        allow_shell=cell.track["allow_shell"],
        sandbox=Sandbox(SandboxPolicy.of(cell.track), gpu=cell.gpu.cuda),
        secret_env=redactor.names,
    )
    transcript = Transcript(folder / "transcript.jsonl", redactor)
    prompt = problem.render_prompt(cell.gpu, cell.gpu.shape_set)
    job = AgentJob(
        workspace=workspace,
        prompt=prompt,
        budgets=Budgets.of_cell(cell.model, cell.track),
        model=cell.model,
        toolbox=toolbox,
        transcript=transcript,
        folder=folder,
        solutions=problem.solutions(),
    )
    agent = runner_for(cell.harness).run(job)
    if agent.fault is None:
        keep_agent(folder, agent)
    return agent


def work_cell(cell: Cell, folder: Path, redactor: Redactor) -> CellResult:
    mismatch = gpu_mismatch(cell.gpu)
    if (
        mismatch
    ):  # asked here, where the cell grades, before its agent runs; a kept agent's work waits for the right card
        return CellResult(Outcome.GPU_MISMATCH, mismatch)
    started = time.monotonic()
    problem = load_problem(Path(cell.problem_dir), cell.track["name"])
    roofline = load_roofline(cell.paths["roofline_specs"], cell.gpu.roofline)
    workspace = folder / "workspace"
    agent = reusable_agent(folder)
    if agent is None:  # a first run, or a kept one whose workspace changed since: redone whole
        clear_for_rerun(cell, keep=False)
        folder.mkdir(parents=True)
    grade_with = grader_for(cell, problem, roofline, folder)
    if agent is None:
        agent = run_agent(cell, folder, prepare_workspace(workspace, problem.root), problem, grade_with, redactor)
    transcript = folder / "transcript.jsonl"
    solution = workspace / "solution.py"
    graded = redactor.data(grade_with("full", solution, "final")) if solution.exists() else None
    outcome = final_outcome(fault_outcome(agent), agent.stop_reason, graded)
    source = solution.read_text() if solution.exists() else ""
    audited = None
    if graded:
        helpers = audit_stage.workspace_helpers(workspace, problem.reference.read_text())
        # the third layer (not on a run the next sweep redoes); its failures end in needs_human, never lose the grade
        judge = LazyModel(cell.judge) if cell.judge and not outcome.is_infra else None
        audited = audit_stage.audit(
            source,
            problem.spec.forbidden,
            graded,
            problem=problem,
            transcript=transcript,
            helpers=helpers,
            judge=judge,
            judge_deadline=judge_deadline(cell, started),
        )
        audited = redactor.data(audited)
    if solution.exists():
        (folder / "solution.py").write_text(redactor.text(source))  # the record's copy; the graded file is untouched
    if graded:
        (folder / "grade.json").write_text(json.dumps(graded, indent=1, default=str))
    if audited:
        (folder / "audit.json").write_text(json.dumps(audited, indent=1, default=str))
    graded = graded or {}
    passed = outcome == Outcome.PASS
    return CellResult(
        outcome,
        message=cell_message(agent.fault, graded),
        score=graded.get("score") if passed else None,
        score_public=graded.get("score_public") if passed else None,
        score_held_out=graded.get("score_held_out") if passed else None,
        basis=graded.get("basis"),
        speedup=graded.get("speedup", {}),
        shapes=[ShapeScore.from_json(shape) for shape in graded.get("shapes", [])],
        verdict=audited["verdict"] if audited else None,
        stop_reason=agent.stop_reason.value,
        turns=agent.turns,
        **spend(agent, audited),
        agent_s=agent.wall_s,
        grade_s=graded.get("grade_s"),
        steps=agent.steps,
        env=graded.get("env"),
        verdicts=graded.get("verdicts"),
        kernelbench=graded.get("kernelbench") if "verdicts" in graded else None,
    )
