"""The launch stage: cells go to an executor (inline, local processes or Slurm, through submitit).

Every launcher calls ``on_start(cell)`` and ``on_done(cell, result)`` in the orchestrator process, so the
records are identical whichever launcher ran the cell. A job that dies (node failure, preemption, time limit)
becomes an infra result and is requeued up to ``requeue_infra`` times.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from kbsweep import KbsweepError, gpus
from kbsweep.cell import run_cell
from kbsweep.matrix import Cell
from kbsweep.outcomes import Outcome

OnStart = Callable[[Cell], None]
OnDone = Callable[[Cell, Dict[str, Any]], None]
GRADE_SLACK_MIN = 30


def run_cell_pinned(cell: Cell, visible_gpu: Optional[str]) -> Dict[str, Any]:
    """The job function: pin the GPU this cell's grades use, then run the cell."""
    if visible_gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_gpu
    return run_cell(cell)


def infra_result(cell: Cell, outcome: Outcome, message: str) -> Dict[str, Any]:
    return {"outcome": outcome.value, "message": message, "key": cell.key, "cell": cell.label, "finished": time.time()}


class InlineLauncher:
    """Cells one after another in this process (debugging, tests)."""

    def __init__(self, conf: Dict[str, Any]):
        self.conf = conf

    def run(self, cells: List[Cell], on_start: OnStart, on_done: OnDone) -> None:
        for cell in cells:
            on_start(cell)
            on_done(cell, run_cell(cell))


class SubmititLauncher:
    """Cells as submitit jobs, ``concurrency`` at a time; ``cluster`` is local or slurm."""

    def __init__(self, conf: Dict[str, Any], cluster: str):
        import submitit

        self.conf = conf
        self.cluster = cluster
        self.executor = submitit.AutoExecutor(folder=conf["folder"], cluster=cluster)
        self.gpus = [str(g["index"]) for g in gpus.list_gpus()] if cluster == "local" else []

    def parameters(self, cell: Cell) -> Dict[str, Any]:
        minutes = int(cell.track["time_cap_s"] / 60) + GRADE_SLACK_MIN
        params: Dict[str, Any] = {"timeout_min": minutes, "name": f"kbsweep-{cell.key}"}
        if self.cluster == "slurm":
            slurm = self.conf["slurm"]
            world = max(1, int(cell.track.get("world_size", 1)))
            params.update(
                nodes=1,
                tasks_per_node=1,
                cpus_per_task=slurm["cpus_per_task"],
                mem_gb=slurm["mem_gb"],
                slurm_partition=slurm["partition"],
                slurm_account=slurm["account"],
                slurm_qos=slurm["qos"],
                slurm_setup=list(slurm["setup"]),
                slurm_additional_parameters=dict(slurm["additional_parameters"]),
            )
            if cell.gpu["device"] == "cuda" or world > 1:
                params["gpus_per_node"] = world
            params = {k: v for k, v in params.items() if v is not None}
        return params

    def submit(self, cell: Cell, slot: int):
        self.executor.update_parameters(**self.parameters(cell))
        gpu = self.gpus[slot % len(self.gpus)] if self.gpus else None
        return self.executor.submit(run_cell_pinned, cell, gpu)

    def run(self, cells: List[Cell], on_start: OnStart, on_done: OnDone) -> None:
        pending = list(cells)
        running: Dict[Any, tuple] = {}
        requeues: Dict[str, int] = {}
        concurrency = max(1, int(self.conf["concurrency"]))
        free_slots = list(range(concurrency))
        while pending or running:
            while pending and free_slots:
                cell, slot = pending.pop(0), free_slots.pop(0)
                on_start(cell)
                running[self.submit(cell, slot)] = (cell, slot)
            time.sleep(0.5)
            for job in [j for j in running if j.done()]:
                cell, slot = running.pop(job)
                free_slots.append(slot)
                result = self.collect(job, cell)
                if Outcome(result["outcome"]) == Outcome.NODE_FAILURE and requeues.get(cell.key, 0) < self.conf["requeue_infra"]:
                    requeues[cell.key] = requeues.get(cell.key, 0) + 1
                    pending.append(cell)
                    continue
                on_done(cell, result)

    def collect(self, job: Any, cell: Cell) -> Dict[str, Any]:
        try:
            return job.result()
        except Exception as exc:  # the job died: killed, timed out, preempted, node lost
            first = str(exc).strip().splitlines()
            return infra_result(cell, Outcome.NODE_FAILURE, f"job {job.job_id} failed: {first[0][:300] if first else exc}")


def make_launcher(conf: Dict[str, Any]):
    kind = conf["kind"]
    if kind == "inline":
        return InlineLauncher(conf)
    if kind in ("local", "slurm"):
        Path(conf["folder"]).mkdir(parents=True, exist_ok=True)
        return SubmititLauncher(conf, kind)
    raise KbsweepError(f"unknown launcher kind '{kind}' (inline, local, slurm)")
