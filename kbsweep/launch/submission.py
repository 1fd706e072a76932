"""What a submitit launcher (:mod:`kbsweep.launch.launchers`) submits next, and how Slurm takes many cells at once.

Which: the first pending cell whose model provider is below its cap (``model.concurrency``), a preferred one first
where the launcher has a preference. How, on Slurm: the cells one fill of the queue starts go as job arrays
(submitit's ``executor.batch()``), one per set of cells with the same job parameters and at most
``launcher.slurm.max_array_size`` tasks each, each array running at most ``launcher.slurm.array_parallelism`` of its
tasks at once (Slurm's ``--array=0-N%P``). A task stays one cell: its own job id (``<array>_<index>``) is what is
polled, cancelled (preempted, Ctrl-C) and accounted, and a requeued cell goes in a later array.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Callable, Dict, Iterable, List, Optional

from kbsweep.errors import InfraError
from kbsweep.planner.matrix import Cell
from kbsweep.tracking.tracker import provider_of


def provider_caps(cells: Iterable[Cell]) -> Dict[str, int]:
    """Cells at once per model provider: the smallest ``model.concurrency`` among the sweep's models it serves.
    Only models that call a provider (litellm) are capped."""
    caps: Dict[str, int] = {}
    for cell in cells:
        if cell.model.get("provider") == "litellm":
            provider = provider_of(cell.model)
            caps[provider] = min(caps.get(provider, cell.model["concurrency"]), cell.model["concurrency"])
    return caps


def next_cell(
    pending: Iterable[Cell],
    running: List[Cell],
    caps: Dict[str, int],
    preferred: Optional[Callable[[Cell], bool]] = None,
) -> Optional[Cell]:
    """The first pending cell whose provider is below its cap; the first ``preferred`` one if there is one. A
    cell's agent makes one model call at a time, so the caps bound the calls in flight per provider across every
    process of the sweep (the judge's calls come on top)."""
    busy = Counter(provider_of(cell.model) for cell in running)
    first = None
    for cell in pending:
        provider = provider_of(cell.model)
        if provider in caps and busy[provider] >= caps[provider]:
            continue
        if preferred is None or preferred(cell):
            return cell
        if first is None:
            first = cell
    return first


class ArrayTask:
    """A cell's place in the next job array; once :func:`submit_arrays` has run, its submitit job (whose
    attributes it answers for: ``done``, ``result``, ``cancel``, ``state``, ``job_id``, ...)."""

    def __init__(self, cell: Cell):
        self.cell = cell
        self.job: Any = None

    def __getattr__(self, name: str) -> Any:
        if self.job is None:
            raise AttributeError(f"{name}: the array of {self.cell.label} was never submitted")
        return getattr(self.job, name)


def submit_arrays(
    executor: Any,
    tasks: List[ArrayTask],
    parameters: Callable[[Cell], Dict[str, Any]],
    job: Callable,
    parallelism: int,
    max_size: int,
) -> None:
    """Submit ``tasks`` as job arrays: one per set of equal ``parameters(cell)`` (an array has one time limit and
    GPU count) and at most ``max_size`` long, each running at most ``parallelism`` tasks at once; each task gets
    its job, ``job(cell, None)``. sbatch refusing an array is an InfraError naming a cell of it."""
    groups: Dict[str, List[ArrayTask]] = {}
    for task in tasks:
        groups.setdefault(json.dumps(parameters(task.cell), sort_keys=True, default=str), []).append(task)
    for key, group in groups.items():
        for start in range(0, len(group), max_size):
            chunk = group[start : start + max_size]
            executor.update_parameters(**json.loads(key), slurm_array_parallelism=min(parallelism, len(chunk)))
            try:
                with executor.batch():
                    jobs = [executor.submit(job, task.cell, None) for task in chunk]
            except (
                Exception
            ) as exc:  # sbatch refused it (a bad partition, a down controller, a full queue): no traceback
                detail = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
                what = chunk[0].cell.label if len(chunk) == 1 else f"{len(chunk)} cells ({chunk[0].cell.label}, ...)"
                raise InfraError(f"Slurm refused the job of {what}: {detail}") from None
            for task, submitted in zip(chunk, jobs):
                task.job = submitted
