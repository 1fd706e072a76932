"""Warm grading processes (kbsweep.grader.shared.zygote): grades of one folder fork their runner from one zygote, yet
what a candidate leaves behind (a process, files in /tmp and /dev/shm) is gone before the next, it cannot read
its zygote's memory, and a grade that breaches a limit takes its zygotes with it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.grading import CPU, graded
from tests.test_grader import CASES
from tests.test_trust import candidate

LEAVE = """
import json, os, time
from pathlib import Path
for folder in ("/tmp", "/dev/shm"):
    Path(folder, "left-behind").write_text("x")
if os.fork() == 0:  # a daemon of its own session, meant to outlive the grade
    os.setsid()
    time.sleep(600)
    os._exit(0)
try:
    with open(f"/proc/{os.getppid()}/mem", "rb") as mem:  # its zygote's memory
        mem.read(1)
    readable = True
except OSError:
    readable = False
started = open(f"/proc/{os.getppid()}/stat").read().rpartition(")")[2].split()[19]
Path(__file__).with_name("seen.json").write_text(json.dumps({"zygote": started, "zygote_memory": readable}))
"""

LOOK = """
import json, os
from pathlib import Path
others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())]
Path(__file__).with_name("seen.json").write_text(json.dumps({
    "zygote": open(f"/proc/{os.getppid()}/stat").read().rpartition(")")[2].split()[19], "others": [open(f"/proc/{p}/cmdline").read() for p in others],
    "left": [f for folder in ("/tmp", "/dev/shm") for f in os.listdir(folder) if f == "left-behind"],
}))
"""


def seen(log_dir: Path) -> dict:
    return json.loads((log_dir / "candidate/seen.json").read_text())


def test_a_warm_runner_starts_clean_and_cannot_read_its_zygote(problem, roofline, tmp_path):  # noqa: F811
    grades = tmp_path / "grades"
    first = graded(
        problem, candidate(tmp_path / "a", LEAVE), CPU, roofline, mode="check", timeout_s=180, log_dir=grades / "1"
    )
    second = graded(
        problem, candidate(tmp_path / "b", LOOK), CPU, roofline, mode="check", timeout_s=180, log_dir=grades / "2"
    )
    assert first["outcome"] == second["outcome"] == "pass", (first.get("message"), second.get("message"))
    left, looked = seen(grades / "1"), seen(grades / "2")
    assert left["zygote"] == looked["zygote"]  # both runners forked from one zygote (its start time)
    assert left["zygote_memory"] is False  # not dumpable: its memory is closed to the candidates it forks
    assert looked["others"] == [] and looked["left"] == []  # the daemon and the files were swept before the next fork


def test_a_breach_discards_the_zygotes(problem, roofline, tmp_path):  # noqa: F811
    grades = tmp_path / "grades"
    before = graded(
        problem, candidate(tmp_path / "a", LOOK), CPU, roofline, mode="check", timeout_s=180, log_dir=grades / "1"
    )
    hung = graded(problem, CASES / "hang.py", CPU, roofline, mode="check", timeout_s=8, log_dir=grades / "2")
    after = graded(
        problem, candidate(tmp_path / "b", LOOK), CPU, roofline, mode="check", timeout_s=180, log_dir=grades / "3"
    )
    assert (before["outcome"], hung["outcome"], after["outcome"]) == ("pass", "grade_timeout", "pass")
    assert seen(grades / "1")["zygote"] != seen(grades / "3")["zygote"]  # a fresh zygote after the breach


def test_the_referee_zygote_probes_references(problem, tmp_path, monkeypatch):  # noqa: F811
    """A one-file grade probes its reference in a child of the referee's zygote (no process of its own): a good
    reference passes, a broken one is named, one that hangs is stopped at the probe's limit (and its zygote with
    it); a zygote runs no module its side does not list."""
    import shutil
    import subprocess
    from types import SimpleNamespace

    import pytest

    from kbsweep import KbsweepError
    from kbsweep.config.problems import load_problem
    from kbsweep.grader import zygotes
    from kbsweep.grader.processes import referee_prober, zygote_view
    from kbsweep.planner import validate
    from kbsweep.sandbox.confine import SandboxPolicy, grading_view

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    no_subprocess = SimpleNamespace(
        run=lambda *a, **k: pytest.fail("probed in a subprocess"), TimeoutExpired=subprocess.TimeoutExpired
    )
    monkeypatch.setattr(validate, "subprocess", no_subprocess)

    def probed(source: str) -> tuple:
        root = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
        shutil.copytree(problem.root, root)
        if source:
            (root / "reference.py").write_text(source)
        copy = load_problem(root, "demo")
        return copy, referee_prober(copy, "cpu", 1, (), SandboxPolicy())

    good, prober = probed("")
    validate.check_references([validate.reference_probe(good)], prober)
    assert validate.digest(good.grader_reference, validate.smallest(good)) in validate.known_good(validate.cache_file())
    broken, prober = probed("raise RuntimeError('deck bug')\n")
    with pytest.raises(KbsweepError, match="does not import: RuntimeError: deck bug"):
        validate.check_references([validate.reference_probe(broken)], prober)
    hang, prober = probed("import time\ntime.sleep(600)\n")
    monkeypatch.setattr(validate, "PROBE_TIMEOUT_S", 5.0)
    with pytest.raises(KbsweepError, match="took over 15 s"):
        validate.check_references([validate.reference_probe(hang)], prober)
    assert not [
        z for z in zygotes.LIVE if z.key[4] == tuple(map(str, grading_view(hang.root)))
    ]  # closed with its child
    judge = zygotes.take("referee", *zygote_view(good, "cpu", 1, (), SandboxPolicy()))
    assert judge.run("kbsweep.cli", "", 60)[0] == 70  # not one of the referee's entries: the child exits at once
    zygotes.discard(judge)
