"""Where a track's problem folders are, in either of its formats: kbsweep folders under the config's problem roots,
or a folder of KernelBench files or of GPU MODE problem folders, each materialized as a kbsweep problem folder
(:mod:`kbsweep.config.kernelbench`, :mod:`kbsweep.config.gpumode`)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from kbsweep.config import gpumode
from kbsweep.config.kernelbench import kernelbench_names, materialize_all
from kbsweep.errors import KbsweepError


def find_problem_dir(
    roots: List[str], problems_dir: str, name: str, fmt: str = "kbsweep", kernelbench_version: Optional[str] = None
) -> Path:
    """The folder of one problem; later roots override earlier ones."""
    return find_problem_dirs(roots, problems_dir, [name], fmt, kernelbench_version)[0]


def find_problem_dirs(
    roots: List[str],
    problems_dir: str,
    names: List[str],
    fmt: str = "kbsweep",
    kernelbench_version: Optional[str] = None,
) -> List[Path]:
    """The folders of ``names``, in order (KernelBench files generated together: one sizing child for all)."""
    if fmt == "kernelbench":
        return materialize_all(kernelbench_folder(roots, problems_dir), names, kernelbench_version)
    if fmt == "gpumode":
        return gpumode.materialize_all(kernelbench_folder(roots, problems_dir), names)
    return [kbsweep_problem_dir(roots, problems_dir, name) for name in names]


def kbsweep_problem_dir(roots: List[str], problems_dir: str, name: str) -> Path:
    for root in reversed(roots):
        candidate = Path(root) / problems_dir / name
        if candidate.is_dir():
            return candidate
    raise KbsweepError(f"unknown problem '{problems_dir}/{name}' (searched {', '.join(map(str, roots))})")


def kernelbench_folder(roots: List[str], problems_dir: str) -> Path:
    for root in reversed(roots):
        folder = Path(root) / problems_dir  # an absolute problems_dir wins over the root
        if folder.is_dir():
            return folder
    raise KbsweepError(f"KernelBench folder '{problems_dir}' not found")


def track_problem_names(roots: List[str], problems_dir: str, fmt: str = "kbsweep") -> List[str]:
    if fmt == "kernelbench":
        return kernelbench_names(kernelbench_folder(roots, problems_dir))
    if fmt == "gpumode":
        return gpumode.gpumode_names(kernelbench_folder(roots, problems_dir))
    names: set[str] = set()
    for root in roots:
        folder = Path(root) / problems_dir
        if folder.is_dir():
            names.update(p.name for p in folder.iterdir() if (p / "problem.yaml").exists())
    return sorted(names)
