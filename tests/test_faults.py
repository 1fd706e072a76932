"""Faults lose nothing: racing and killed database creation, orphaned cell jobs, provider faults, memory and disk
measured per sandbox (docs/launch.md, "Faults")."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
from omegaconf import OmegaConf

from kbsweep.cell import cell_busy, cell_lock_path
from kbsweep.launch.sweep import plan
from kbsweep.sandbox.confine import Sandbox, SandboxPolicy
from kbsweep.sandbox.watch import HOST_SHARE, host_memory_mib, memory_cap_mib
from kbsweep.tracking.mlflow_store import runs_frame
from tests.test_orphans import demo_cell

REPO = Path(__file__).resolve().parent.parent


def open_tracker(uri: str, name: str) -> subprocess.Popen:
    code = f"from kbsweep.tracking.tracker import Tracker; Tracker({uri!r}, '/tmp/unused-artifacts', {name!r}).start_sweep({{}}, 1); print('ok')"
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_creator_killed_while_migrating_then_sweeps_racing_to_create_the_database_all_start(tmp_path):
    """The first creator is killed mid-migration (MLflow migrates for 1-2 s after the first file appears); three
    sweeps then race to create the database on the folder it left, and a later one opens it."""
    db = tmp_path / "outputs" / "mlflow.db"
    uri = f"sqlite:///{db}"
    victim = open_tracker(uri, "victim")
    while not [p for p in db.parent.glob("*mlflow.db*") if not p.name.endswith(".lock")]:
        assert victim.poll() is None, victim.communicate()
        time.sleep(0.01)
    time.sleep(0.8)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    racers = [open_tracker(uri, f"sweep{i}") for i in range(3)]
    for racer in racers:
        out, err = racer.communicate(timeout=300)
        assert racer.returncode == 0 and out.strip() == "ok", err[-2000:]
    later = open_tracker(uri, "later")
    assert later.communicate(timeout=300)[0].strip() == "ok"
    assert not list(db.parent.glob(".mlflow.db.*"))  # the killed creator's partial file is cleared


def test_a_fork_flood_sharing_its_pages_is_not_out_of_memory_but_a_real_hog_is(tmp_path):
    """Ten forks of a process holding 200 MiB share those pages: 200 MiB, not 2.2 GB (RSS summed per process)."""
    flood = (
        "python3 -c \"import os, time; b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]); "
        'kids = [os.fork() or (time.sleep(3), os._exit(0)) for _ in range(10)]; [os.waitpid(k, 0) for k in kids]"'
    )
    policy = SandboxPolicy(memory_mib=600, wall_s=60)
    shared = Sandbox(policy, gpu=True).shell(flood, tmp_path)  # gpu: no address-space rlimit, the watch alone
    assert shared.returncode == 0 and not shared.notes, shared.output
    hog = "python3 -c \"import time; b = bytearray(800 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)\""
    alone = Sandbox(policy, gpu=True).shell(hog, tmp_path)
    assert alone.returncode == 124 and "more than 600 MiB" in alone.notes[0]


def test_what_a_command_prints_counts_against_its_disk_quota(tmp_path):
    """10 MiB in the workspace and 10 MiB of output: each under the 16 MiB quota, together over it."""
    both = "head -c 10M /dev/zero > file; head -c 10M /dev/zero; sleep 10"
    result = Sandbox(SandboxPolicy(disk_mib=16, wall_s=60)).shell(both, tmp_path)
    assert result.returncode == 124 and "over the 16 MiB quota" in result.notes[0]


@pytest.mark.fast
def test_the_default_grading_memory_cap_is_a_share_of_this_host():
    host = host_memory_mib()
    assert OmegaConf.load(REPO / "conf" / "config.yaml").grade.memory_mib is None
    assert memory_cap_mib(None) == HOST_SHARE * host
    assert memory_cap_mib(host * 3) == host and memory_cap_mib(512) == 512  # never more than the host has


def test_a_rerun_reclaims_a_cell_its_dead_sweep_left_running(outputs):
    """An orphaned job holding a cell's lock (its orchestrator gone) is ended and the cell is run again."""
    cell = demo_cell(outputs)
    path = cell_lock_path(cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    hold = (
        "import fcntl, json, time; from kbsweep.tracking.tracker import owner; h = open({path!r}, 'a'); fcntl.flock(h, fcntl.LOCK_EX); "
        "h.write(json.dumps({{'holder': owner()}})); h.flush(); print('held', flush=True); time.sleep(300)"
    )
    orphan = subprocess.Popen(
        [sys.executable, "-c", hold.format(path=str(path))], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert orphan.stdout.readline().strip() == "held" and cell_busy(cell)
    assert plan([cell], {}, set(), force=False)[0] == [cell]
    assert orphan.wait(timeout=10) == -signal.SIGKILL and not cell_busy(cell)


def sweep_processes(outputs: Path) -> List[int]:
    """Processes of a sweep writing under ``outputs``: its orchestrator, cell jobs and their grades."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                seen = (entry / "environ").read_bytes() + (entry / "cmdline").read_bytes()
                if str(outputs).encode() in seen and (entry / "stat").read_text().rpartition(")")[2].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            pass
    return found


def outlived(outputs: Path, grace_s: float) -> List[int]:
    """The sweep's processes still there after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while sweep_processes(outputs) and time.monotonic() < deadline:
        time.sleep(0.2)
    return sweep_processes(outputs)


def test_ten_kills_of_a_running_sweep_lose_nothing_grade_nothing_twice_and_leave_nothing_behind(tmp_path):
    """SIGKILL the orchestrator's process group 10 times at random points (the first while it creates the MLflow
    database): no cell job outlives its orchestrator; then rerun once: every cell finished once, no result
    rewritten, no process left. (The lazy scripted model hands in a wrong kernel at once: a finished cell after a
    single grade.)"""
    outputs = tmp_path / "outputs"
    env = {**os.environ, "KBSWEEP_OUTPUTS": str(outputs), "KBSWEEP_LOCK_DIR": str(tmp_path / "locks")}
    command = [
        sys.executable,
        "-m",
        "kbsweep.cli",
        "-m",
        "launcher=local",
        "gpu=cpu",
        "model=scripted-lazy",
        "problem=scale_shift",
        "repeat=0,1",
    ]
    rng = random.Random(1203)
    journals: Dict[str, int] = {}  # result.json → its mtime when first seen
    for kill in range(10):
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        if kill == 0:
            while not [p for p in outputs.glob("*mlflow.db*") if not p.name.endswith(".lock")]:  # its creation began
                assert proc.poll() is None
                time.sleep(0.01)
            time.sleep(0.8)  # mid-migration
        elif kill % 2:  # while a cell runs (a cell of the lazy model, one grade, takes about 10 s)
            while proc.poll() is None and not any(
                not (p.parent / "result.json").exists() for p in outputs.glob("sweeps/demo/*/transcript.jsonl")
            ):
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 4.0))
        else:  # anywhere
            time.sleep(rng.uniform(0.5, 15.0))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert outlived(outputs, 5.0) == [], f"kill {kill}: cell jobs ran on without their orchestrator"
        for path in outputs.glob("sweeps/demo/*/result.json"):
            journals.setdefault(str(path), path.stat().st_mtime_ns)
    rerun = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    results = {str(p): json.loads(p.read_text()) for p in outputs.glob("sweeps/demo/*/result.json")}
    assert sorted(r["outcome"] for r in results.values()) == ["incorrect", "incorrect"]
    assert all(Path(p).stat().st_mtime_ns == mtime for p, mtime in journals.items())  # none graded twice
    finished = [r for r in runs_frame(f"sqlite:///{outputs}/mlflow.db") if r["status"] == "FINISHED"]
    assert sorted(r["cell_key"] for r in finished) == sorted(r["key"] for r in results.values())  # one record each
    assert outlived(outputs, 10.0) == []  # a finished job may still be exiting as the orchestrator returns
