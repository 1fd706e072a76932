"""Faults lose nothing: racing and killed database creation, orphaned cell jobs, provider faults, memory and disk
measured per sandbox (docs/launch.md, "Faults")."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def open_tracker(uri: str, name: str) -> subprocess.Popen:
    code = f"from kbsweep.tracking import Tracker; Tracker({uri!r}, '/tmp/unused-artifacts', {name!r}).start_sweep({{}}, 1); print('ok')"
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sweeps_racing_on_a_fresh_database_all_start_and_later_ones_too(tmp_path):
    uri = f"sqlite:///{tmp_path}/outputs/mlflow.db"
    racers = [open_tracker(uri, f"sweep{i}") for i in range(4)]
    for racer in racers:
        out, err = racer.communicate(timeout=300)
        assert racer.returncode == 0 and out.strip() == "ok", err[-2000:]
    later = open_tracker(uri, "later")
    assert later.communicate(timeout=300)[0].strip() == "ok"


def test_a_creator_killed_while_migrating_leaves_no_broken_database(tmp_path):
    for delay in (0.7, 1.0):  # after the first file appears MLflow migrates for 1-2 s: both kills land mid-way
        db = tmp_path / str(delay) / "mlflow.db"
        victim = open_tracker(f"sqlite:///{db}", "victim")
        while not [p for p in db.parent.glob("*mlflow.db*") if not p.name.endswith(".lock")]:
            assert victim.poll() is None, victim.communicate()
            time.sleep(0.01)
        time.sleep(delay)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        after = open_tracker(f"sqlite:///{db}", "after")
        out, err = after.communicate(timeout=300)
        assert out.strip() == "ok", err[-2000:]
        assert not list(db.parent.glob(".mlflow.db.*"))  # a killed creator's partial file is cleared
