"""scripts/test.sh stops the daemons it started (scripts/daemons.sh), on success, failure and Ctrl-C alike, and
leaves those it found running: real processes and pid files stand in for Slurm's and MariaDB's."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
ENDINGS = {"success": ("true", 0), "failure": ("false", 1), "ctrl-c": ("kill -INT $$; sleep 5", 130)}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie (killed, not reaped yet) is gone
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_the_daemons_a_run_started_stop_when_it_ends_and_the_others_stay(ending, tmp_path):
    found, started = tmp_path / "found.pid", tmp_path / "started.pid"
    before = subprocess.Popen(["sleep", "300"], start_new_session=True)  # running before the run: not its to stop
    found.write_text(str(before.pid))
    command, code = ENDINGS[ending]
    script = (
        f"set -euo pipefail; . scripts/daemons.sh && stop_daemons_on_exit\n"
        f"setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > {started}\n"  # a daemon the run starts
        f"{command}\n"
    )
    env = {**os.environ, "KBSWEEP_DAEMON_PIDFILES": f"{started} {found}"}
    try:
        proc = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == code, proc.stderr
        pid = int(started.read_text())
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid), f"the daemon the run started outlived it ({ending})"
        assert before.poll() is None, "a daemon running before the run was stopped"
        assert f"stopped the daemons this run started: {pid}" in proc.stderr
    finally:
        before.kill()
        before.wait()
        if started.exists() and alive(int(started.read_text())):
            os.kill(int(started.read_text()), signal.SIGKILL)


def test_test_sh_arms_it_before_it_starts_slurm():
    lines = (REPO / "scripts" / "test.sh").read_text().splitlines()
    armed = next(i for i, line in enumerate(lines) if line.startswith(". scripts/daemons.sh && stop_daemons_on_exit"))
    assert armed < next(i for i, line in enumerate(lines) if "scripts/slurm_up.sh" in line and not line.startswith("#"))
