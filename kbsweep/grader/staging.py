"""The candidate's files copied where a grading process runs them."""

from __future__ import annotations

import shutil
from pathlib import Path


def stage_candidate(solution: Path, folder: Path) -> Path:
    """Copy the candidate into an emptied folder as solution.py (with its workspace's other .py files)."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():  # emptied, not replaced: a warm runner's sandbox has this very folder mounted
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    if solution.name == "solution.py":
        for helper in solution.parent.glob("*.py"):
            shutil.copy2(helper, folder / helper.name)
    shutil.copy2(solution, folder / "solution.py")
    return folder / "solution.py"
