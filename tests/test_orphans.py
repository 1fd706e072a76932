"""A cell never runs twice at once: a running cell (an orphaned job of a killed sweep, say) holds its lock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kbsweep.cell import cell_busy, cell_lock_path
from kbsweep.config.schema import load_gpu
from kbsweep.launch.sweep import plan
from kbsweep.planner.matrix import Cell

REPO = Path(__file__).resolve().parent.parent


def demo_cell(outputs: Path) -> Cell:
    return Cell(
        sweep="demo",
        key="0123456789abcdef",
        model={"name": "scripted"},
        gpu=load_gpu("cpu"),
        track={"name": "demo"},
        problem="demo/scale_shift",
        problem_dir=str(REPO / "problems/demo/scale_shift"),
        deck_version="x",
        repeat=0,
        paths={"outputs": str(outputs)},
        launcher={},
        grade={},
    )


def test_a_held_cell_lock_keeps_the_cell_out_of_the_plan(outputs):
    cell = demo_cell(outputs)
    path = cell_lock_path(cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import fcntl, time; h = open({str(path)!r}, 'a'); fcntl.flock(h, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert cell_busy(cell)
        todo, replay, salvage = plan([cell], {}, set(), force=False)
        assert todo == [] and replay == [] and salvage == []
    finally:
        holder.kill()
        holder.wait()
    assert not cell_busy(cell)
    assert plan([cell], {}, set(), force=False)[0] == [cell]


def test_folders_a_killed_process_left_in_the_temporary_folder_go_at_the_next_start(tmp_path):
    """A process that made kbsweep's private temporary folders is killed with SIGKILL (no cleanup of its own runs):
    they outlive it until the next kbsweep command starts, which removes them and leaves a live process's alone."""
    import signal

    from kbsweep.paths import owned_tempdir, remove_orphans

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from kbsweep.paths import owned_tempdir as t; "
            "print(*(t(k) for k in ('referee', 'ranks', 'proxy')), flush=True); time.sleep(600)",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    left = [Path(p) for p in holder.stdout.readline().split()]
    mine = owned_tempdir("ranks")
    try:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        assert len(left) == 3 and all(p.is_dir() for p in left)
        cli = subprocess.run([sys.executable, "-m", "kbsweep.cli", "-h"], cwd=REPO, capture_output=True, timeout=120)
        assert cli.returncode == 0, cli.stderr
        assert not any(p.exists() for p in left), left
        assert mine.is_dir() and mine not in remove_orphans()
    finally:
        holder.kill()
        mine.rmdir()
