"""The launch stage: cells go to an executor (inline, local processes or Slurm, through submitit).

A :class:`Launcher` per executor, registered by name in :data:`LAUNCHERS` (a launcher YAML's ``kind``): inline,
and the submitit ones, which share the loop (caps, provider limits, requeue) and override what differs per
cluster (:class:`LocalLauncher`, :class:`SlurmLauncher`). A multi-GPU cell is no launcher of its own: Slurm asks
for its world size in GPUs, locally its grade takes that many from the pool; torchrun starts inside the grade.

Every launcher calls ``on_start(cell)`` once and ``on_done(cell, result)`` once per cell, in the orchestrator
process, so the records are identical whichever launcher ran the cell. A cell starts only when the sweep's budget
(``Launcher.budget``, :mod:`kbsweep.launch.budget`) admits it; the cells it never admits are left unstarted.

A cell's hard wall-clock cap (:func:`cell_cap_s`) is the agent's ``track.time_cap_s`` plus the final grade's
``track.grade_timeout_s`` plus ``launcher.cap_slack_s``. A local job past it is killed with its whole process
tree; a Slurm job gets it as its time limit. A job that ends without a result (killed, timed out, preempted,
node lost) becomes a ``node_failure`` result and is run again, on a fresh cell folder, up to
``launcher.requeue_infra`` times.

GPUs: a local cell may grade on any GPU of the sweep's pool (NVML's list narrowed by CUDA_VISIBLE_DEVICES),
each grade taking the GPU(s) it needs through the machine-wide lock (:mod:`kbsweep.grader.locks`); the agent part holds
none. A Slurm cell is one task on one node with ``--gpus-per-node=track.world_size`` (GPU cells only).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, List, Optional, Type

from kbsweep.cell import clear_for_rerun, run_cell
from kbsweep.config import gpus
from kbsweep.errors import KbsweepError
from kbsweep.grader.torchrun import kill_tree
from kbsweep.launch.budget import Budget
from kbsweep.launch.submission import ArrayTask, next_cell, provider_caps, submit_arrays
from kbsweep.launch.workers import POLL_S, Job, Worker, end_when_gone, grading_of, infra_result
from kbsweep.outcomes import Outcome
from kbsweep.planner.matrix import Cell
from kbsweep.registry import Registry
from kbsweep.tracking.tracker import owner

OnStart = Callable[[Cell], None]
OnDone = Callable[[Cell, Dict[str, Any]], None]
# submitit's USR2 ends a job that cannot checkpoint (a cell cannot), so it comes just before the time limit, not
# its default 90 s before (which, on a short limit, arrives before the job has a handler and kills it outright)
SIGNAL_DELAY_S = 10


def cell_cap_s(cell: Cell, slack_s: float) -> float:
    """The hard wall-clock cap of one cell: agent time cap + final grade timeout + slack."""
    return float(cell.track["time_cap_s"]) + float(cell.track["grade_timeout_s"]) + slack_s


def world_size(cell: Cell) -> int:
    return max(1, int(cell.track.get("world_size", 1)))


def run_cell_pinned(cell: Cell, visible_gpus: Optional[str]) -> Dict[str, Any]:
    """The job function: become a process group of its own (so a kill reaches whatever the cell leaves
    behind), pin the GPU pool its grades draw from when given, then run the cell."""
    if os.getpgrp() != os.getpid():
        os.setsid()
    if visible_gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_gpus
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's indices = NVML's
    return run_cell(cell)


def supervised(job: Job, cell: Cell, visible_gpus: Optional[str], supervisor: str) -> Dict[str, Any]:
    """A local job: ``job(cell, visible_gpus)``, ended with its whole tree once the orchestrator ``supervisor``
    (a process stamp) is gone. An unsupervised cell would run on with nobody to log it, and hold its lock against
    the rerun. (Not on Slurm: there a hung job must end at its time limit, TIMEOUT, not FAILED.)"""
    threading.Thread(target=end_when_gone, args=(supervisor,), daemon=True).start()
    return job(cell, visible_gpus)


class Launcher(ABC):
    """Runs a sweep's cells: ``on_start(cell)`` once and ``on_done(cell, result)`` once per cell, in this process.
    A launcher YAML's ``kind`` names a subclass registered in :data:`LAUNCHERS`; ``conf`` is that YAML, resolved."""

    def __init__(self, conf: Dict[str, Any]):
        self.conf = conf
        self.budget = Budget()  # the sweep's budget (kbsweep.launch.budget): whether a cell may start, what it spent

    @classmethod
    def from_conf(cls, conf: Dict[str, Any]) -> "Launcher":
        """The launcher ``conf`` asks for (a kind may pick a variant by its other keys)."""
        return cls(conf)

    def check(self, cells: List[Cell]) -> None:  # noqa: B027 - a default, not a duty: most launchers run any cell
        """Refuse cells this launcher cannot run (a one-line KbsweepError); the sweep asks before its preflight. By
        default every cell is accepted."""

    @abstractmethod
    def run(self, cells: List[Cell], on_start: OnStart, on_done: OnDone) -> None: ...


LAUNCHERS: Registry[Type[Launcher]] = Registry("launcher.kind")


@LAUNCHERS.register("inline")
class InlineLauncher(Launcher):
    """Cells one after another in this process (debugging, tests); no cap, no requeue."""

    def run(self, cells: List[Cell], on_start: OnStart, on_done: OnDone) -> None:
        for cell in cells:
            if not self.budget.admit(cell):  # nothing runs beside it: no later cell fits either
                break
            on_start(cell)
            result = run_cell(cell)
            self.budget.ended(cell, result)
            on_done(cell, result)


@dataclass
class Running:
    cell: Cell
    started: float  # monotonic, at submission
    killed: Optional[str] = None  # why the launcher ended it


class SubmititLauncher(Launcher):
    """Cells as submitit jobs, ``concurrency`` at a time, capped per provider, requeued after a node failure.
    Subclasses are one submitit cluster each and override what differs: the job's parameters, how a job is
    submitted, stopped and read back, and when a running job is ended early.

    ``job`` is the function a job runs, ``job(cell, visible_gpus) -> result``.
    """

    cluster: ClassVar[str]

    def __init__(self, conf: Dict[str, Any], job: Job = run_cell_pinned):
        import submitit

        super().__init__(conf)
        self.job = job
        Path(conf["folder"]).mkdir(parents=True, exist_ok=True)
        self.executor = submitit.AutoExecutor(folder=conf["folder"], cluster=self.cluster)

    def cap_s(self, cell: Cell) -> float:
        return cell_cap_s(cell, float(self.conf["cap_slack_s"]))

    @abstractmethod
    def parameters(self, cell: Cell) -> Dict[str, Any]:
        """submitit parameters of one cell's job."""

    @abstractmethod
    def submit(self, cell: Cell) -> Any:
        """The submitted job of one cell (or its place in what :meth:`submitted` submits)."""

    def submitted(self) -> None:
        """After a fill's submissions: submit what they left waiting."""

    @abstractmethod
    def stop(self, job: Any) -> None:
        """End a job now."""

    @abstractmethod
    def overdue(self, job: Any, state: Running) -> Optional[str]:
        """Why a running job must be ended now, or None."""

    def result_lost(self, job: Any, cell: Cell) -> Optional[Dict[str, Any]]:
        """A ``node_failure`` result for a finished job whose result will never come, else None (wait for it)."""
        return None

    def run(self, cells: List[Cell], on_start: OnStart, on_done: OnDone) -> None:
        self.check(cells)
        running: Dict[Any, Running] = {}
        try:
            self.loop(deque(cells), running, on_start, on_done)
        except BaseException:  # Ctrl-C or a crash: the cells stop with the orchestrator; a rerun resumes
            for job in running:
                self.stop(job)
            raise

    def loop(self, pending: deque, running: Dict[Any, Running], on_start: OnStart, on_done: OnDone) -> None:
        attempts: Dict[str, int] = {}
        concurrency = max(1, int(self.conf["concurrency"]))
        caps = provider_caps(pending)

        def fill() -> None:
            while len(running) < concurrency:
                cells = [state.cell for state in running.values()]
                cell = next_cell(pending, cells, caps, self.preferred(cells))
                if cell is None or not self.budget.admit(cell):
                    break
                pending.remove(cell)
                if cell.key not in attempts:
                    on_start(cell)
                attempts[cell.key] = attempts.get(cell.key, 0) + 1
                running[self.submit(cell)] = Running(cell, time.monotonic())
            self.submitted()

        while pending or running:
            fill()
            if not running:  # the budget admits no pending cell with none in flight: they stay unstarted
                break
            self.wait(POLL_S)
            for job, state in list(running.items()):
                result = self.poll(job, state)
                if result is None:
                    continue
                del running[job]
                self.budget.ended(state.cell, result)
                if (
                    Outcome(result["outcome"]) == Outcome.NODE_FAILURE
                    and attempts[state.cell.key] <= self.conf["requeue_infra"]
                ):
                    print(f"[kbsweep] requeued {state.cell.label}: {result['message']}", file=sys.stderr, flush=True)
                    clear_for_rerun(state.cell)  # a finished agent's work stays, to be graded again
                    pending.append(state.cell)
                    continue
                on_done(
                    state.cell, result
                )  # first: the sweep logs it on a thread of its own, and counts it before the next
                fill()

    def preferred(self, running: List[Cell]) -> Optional[Callable[[Cell], bool]]:
        """Which pending cells the next submit runs first, where it matters (workers outlive cells); None: in order."""
        return None

    def wait(self, timeout_s: float) -> None:
        """Until a job may have ended: a poll interval."""
        time.sleep(timeout_s)

    def poll(self, job: Any, state: Running) -> Optional[Dict[str, Any]]:
        """The job's result once it has ended, else None; ends a job :meth:`overdue` says must end."""
        if state.killed is None:
            state.killed = self.overdue(job, state)
            if state.killed is not None:
                self.stop(job)
        if state.killed is not None:
            return infra_result(state.cell, Outcome.NODE_FAILURE, state.killed) if self.reaped(job) else None
        return self.collect(job, state.cell) if job.done() else None

    def reaped(self, job: Any) -> bool:
        """Whether a job this launcher ended is gone (so its cell may be reported and run again)."""
        return True

    def collect(self, job: Any, cell: Cell) -> Dict[str, Any]:
        lost = self.result_lost(job, cell)
        if lost is not None:
            return lost
        try:
            return job.result()
        except Exception as exc:  # the job died: killed, timed out, node lost
            first = str(exc).strip().splitlines()
            return infra_result(
                cell, Outcome.NODE_FAILURE, f"job {job.job_id} failed ({job.state}): {first[0][:300] if first else exc}"
            )


@LAUNCHERS.register("local")
class LocalLauncher(SubmititLauncher):
    """Local processes; a grade takes free GPUs of the machine's pool through the machine-wide lock."""

    cluster = "local"

    def __init__(self, conf: Dict[str, Any], job: Job = run_cell_pinned):
        super().__init__(conf, job)
        self.pool = [g["visible"] for g in gpus.visible_gpus()]

    @classmethod
    def from_conf(cls, conf: Dict[str, Any]) -> Launcher:
        """Warm workers unless ``launcher.warm_workers`` is off."""
        return WarmLocalLauncher(conf) if conf.get("warm_workers", True) else cls(conf)

    def parameters(self, cell: Cell) -> Dict[str, Any]:
        # a backstop: the orchestrator kills the job at the cap
        return {"name": f"kbsweep-{cell.key}", "timeout_min": math.ceil(self.cap_s(cell) / 60) + 1}

    def check(self, cells: List[Cell]) -> None:
        """Every GPU cell's world size must fit the pool."""
        for cell in cells:
            if cell.gpu.cuda and world_size(cell) > len(self.pool):
                raise KbsweepError(
                    f"{cell.label} needs {world_size(cell)} GPU(s); this machine offers {len(self.pool)} "
                    f"(NVML, narrowed by CUDA_VISIBLE_DEVICES){' — use gpu=cpu' if not self.pool else ''}"
                )

    def submit(self, cell: Cell) -> Any:
        self.executor.update_parameters(**self.parameters(cell))
        visible = ",".join(self.pool) if cell.gpu.cuda else ""
        return self.executor.submit(supervised, self.job, cell, visible, owner())

    def stop(self, job: Any) -> None:
        kill_tree(int(job.job_id))  # the whole process tree: a hung grade, a detached process, NCCL ranks

    def overdue(self, job: Any, state: Running) -> Optional[str]:
        if time.monotonic() - state.started > self.cap_s(state.cell):
            return f"killed at the cell's wall-clock cap of {self.cap_s(state.cell):.0f} s"
        return None

    def reaped(self, job: Any) -> bool:
        return job.done()  # the killed controller is reaped on a later poll

    def result_lost(self, job: Any, cell: Cell) -> Optional[Dict[str, Any]]:
        if job.paths.result_pickle.exists():  # local disk: no late result to wait for
            return None
        tail = job.stderr().strip().splitlines()[-1:] if job.stderr() else []
        return infra_result(
            cell,
            Outcome.NODE_FAILURE,
            f"job {job.job_id} ended without a result ({job.state}){': ' + tail[0][:300] if tail else ''}",
        )


@LAUNCHERS.register("slurm")
class SlurmLauncher(SubmititLauncher):
    """Slurm jobs: one task on one node, GPUs = the cell's world size, time limit = its cap. The outputs folder
    must be on a filesystem the compute nodes share (docs/launch.md)."""

    cluster = "slurm"

    def __init__(self, conf: Dict[str, Any], job: Job = run_cell_pinned):
        if not shutil.which("sbatch"):
            raise KbsweepError("launcher=slurm needs Slurm's commands (sbatch, srun, sacct) on PATH; none found here")
        super().__init__(conf, job)
        self.waiting: List[ArrayTask] = []

    def parameters(self, cell: Cell) -> Dict[str, Any]:
        slurm = self.conf["slurm"]
        params = dict(
            name=f"kbsweep-{cell.sweep}",  # an array's name: its cells' sweep
            timeout_min=math.ceil(self.cap_s(cell) / 60),
            slurm_signal_delay_s=SIGNAL_DELAY_S,
            nodes=1,
            tasks_per_node=1,
            gpus_per_node=world_size(cell) if cell.gpu.cuda else None,
            cpus_per_task=slurm["cpus_per_task"],
            mem_gb=slurm["mem_gb"],
            slurm_partition=slurm["partition"],
            slurm_account=slurm["account"],
            slurm_qos=slurm["qos"],
            slurm_setup=list(slurm["setup"]),
            slurm_additional_parameters=dict(slurm["additional_parameters"]),
        )
        return {k: v for k, v in params.items() if v is not None}

    def submit(self, cell: Cell) -> ArrayTask:
        self.waiting.append(ArrayTask(cell))
        return self.waiting[-1]

    def submitted(self) -> None:
        """The fill's cells as job arrays (:mod:`kbsweep.launch.submission`)."""
        waiting, self.waiting = self.waiting, []
        slurm = self.conf["slurm"]
        submit_arrays(
            self.executor,
            waiting,
            self.parameters,
            self.job,
            int(slurm["array_parallelism"]),
            int(slurm["max_array_size"]),
        )

    def stop(self, job: ArrayTask) -> None:
        if job.job is not None:  # an array sbatch refused has nothing to cancel
            job.cancel(check=False)  # scancel of this cell's task alone

    def overdue(self, job: Any, state: Running) -> Optional[str]:
        # submitit would wait on a PREEMPTED job forever; Slurm ends a job past its time limit itself
        return f"Slurm job {job.job_id} was preempted" if job.state == "PREEMPTED" else None


class WarmLocalLauncher(LocalLauncher):
    """Local cells in ``concurrency`` long-lived workers (:class:`Worker`) instead of a fresh process per cell:
    the same caps, requeues and supervision, without paying Python's, torch's and MLflow's imports and the
    grading zygotes' start for every cell (~15 CPU-seconds a cell on a 2-core machine)."""

    def __init__(self, conf: Dict[str, Any], job: Job = run_cell_pinned):
        Launcher.__init__(self, conf)  # no submitit executor: the workers are this launcher's jobs
        self.job = job
        self.pool = [g["visible"] for g in gpus.visible_gpus()]
        self.idle: List[Worker] = []
        self.answered = threading.Event()
        Path(conf["folder"]).mkdir(parents=True, exist_ok=True)

    def submit(self, cell: Cell) -> Worker:
        worker = self.idle.pop() if self.idle else Worker(Path(self.conf["folder"]), owner(), self.answered)
        worker.start(self.job, cell, ",".join(self.pool) if cell.gpu.cuda else "")
        return worker

    def stop(self, job: Worker) -> None:
        job.kill()

    def preferred(self, running: List[Cell]) -> Callable[[Cell], bool]:
        """The grading a free worker has zygotes for (its last cell's) while such cells are left; a new worker's,
        one no running cell has. Workers then keep to problems of their own: a worker that changes problem
        starts two more zygotes, seconds of CPU each."""
        if self.idle:
            last = self.idle[-1].cell
            assert last is not None  # a worker is idle once it has answered a cell
            warm = grading_of(last)
            return lambda cell: grading_of(cell) == warm
        taken = {grading_of(cell) for cell in running}
        return lambda cell: grading_of(cell) not in taken

    def wait(self, timeout_s: float) -> None:
        """Until a worker answers (a cell's next one starts at once), at most a poll interval."""
        self.answered.wait(timeout_s)
        self.answered.clear()

    def collect(self, job: Worker, cell: Cell) -> Dict[str, Any]:
        if job.result is None:  # the worker died mid-cell
            job.kill()
            tail = job.stderr().strip().splitlines()[-1:]
            return infra_result(
                cell,
                Outcome.NODE_FAILURE,
                f"worker {job.job_id} ended without a result{': ' + tail[0][:300] if tail else ''}",
            )
        self.idle.append(job)
        return job.result

    def run(self, cells: List[Cell], on_start: OnStart, on_done: OnDone) -> None:
        try:
            super().run(cells, on_start, on_done)
        finally:
            for worker in self.idle:
                worker.stdin.close()
            for worker in self.idle:
                worker.close()
            self.idle.clear()


def make_launcher(conf: Dict[str, Any]) -> Launcher:
    """The launcher a launcher YAML's ``kind`` names (config validation has refused any other name already)."""
    return LAUNCHERS.lookup(conf["kind"], "launcher").from_conf(conf)
