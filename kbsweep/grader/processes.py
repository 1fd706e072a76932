"""The processes of a single-process grade: the trusted referee and the candidate's runner, each in its own sandbox,
forked by warm zygotes or spawned cold, joined by a socket pair, watched for time, memory and disk; and their
environments. (A multi-rank grade's: :mod:`kbsweep.grader.distributed`.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

from kbsweep.config.problems import Problem
from kbsweep.grader import zygotes
from kbsweep.outcomes import Outcome
from kbsweep.paths import REPO_ROOT
from kbsweep.sandbox.confine import Sandbox, SandboxPolicy, grading_view, minimal_env
from kbsweep.sandbox.watch import Watch

if TYPE_CHECKING:
    from kbsweep.grader.referee.request import RefereeRequest

BREACH_OUTCOMES = {"wall": Outcome.GRADE_TIMEOUT, "memory": Outcome.GRADE_OOM, "disk": Outcome.RUNTIME_ERROR}
RUNNER_BOOT = "import sys; sys.path.append({root!r}); from kbsweep.grader.runner.runner import main; main()"


@dataclass
class Supervision:
    """How a grade's processes run: their logs' folder, the time and per-process memory limits, the referee's
    environment, the sandbox, and what the referee sees read-only."""

    log_dir: Path
    timeout_s: float
    memory_mib: float
    env: Dict[str, str]
    sandbox: Sandbox
    readonly: Sequence[Path]


def supervise(request: RefereeRequest, how: Supervision, warm: Optional[zygotes.Zygote] = None) -> Dict[str, Any]:
    """Start the referee (trusted: sees ``how.readonly``, holds the request) and the candidate's runner (sees only
    kbsweep's package and the candidate's folder, in an isolated interpreter), each in its own sandbox, joined by
    a socket pair: forked by warm zygotes (``warm``: the runner's, whose home holds the staged candidate), else
    spawned cold. Watch both (time, memory of each process tree, disk of the candidate's folder and the logs);
    read the referee's one result message from a pipe the runner never holds."""
    log_dir, env, sandbox, readonly = how.log_dir, how.env, how.sandbox, how.readonly
    log_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(request.workdir)
    read_fd, write_fd = os.pipe()
    referee_end, runner_end = socket.socketpair()
    proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)  # the host's: the referee reads the runner's threads there
    request_in, request_out = os.pipe()  # the referee's stdin: its request
    runner: Union[zygotes.Forked, subprocess.Popen[bytes]]
    referee: Union[zygotes.Forked, subprocess.Popen[bytes]]
    with (
        open(log_dir / "grade_stdout.log", "wb") as out,
        open(log_dir / "grade_stderr.log", "wb") as err,
        open(log_dir / "referee.log", "wb") as referee_log,
        open(os.devnull, "rb") as null,
    ):
        if warm is not None:
            judge = zygotes.take("referee", sandbox, env, readonly, warm.home.parent)
            runner = warm.fork(
                workdir,
                ["fd:channel"],
                {
                    "stdin": null.fileno(),
                    "stdout": out.fileno(),
                    "stderr": err.fileno(),
                    "channel": runner_end.fileno(),
                },
            )
            referee = judge.fork(
                judge.home,
                ["fd:result", "fd:channel", "fd:proc", str(runner.pid)],
                {
                    "stdin": request_in,
                    "stdout": referee_log.fileno(),
                    "stderr": referee_log.fileno(),
                    "result": write_fd,
                    "channel": referee_end.fileno(),
                    "proc": proc_fd,
                },
            )
        else:
            runner = sandbox.popen(
                [sys.executable, "-I", "-B", "-c", RUNNER_BOOT.format(root=str(REPO_ROOT)), str(runner_end.fileno())],
                cwd=str(workdir),
                env=runner_env(env),
                writable=[(workdir, str(workdir))],
                readonly=[REPO_ROOT / "kbsweep"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(runner_end.fileno(),),
            )
            referee_dir = log_dir / "referee"
            referee_dir.mkdir(exist_ok=True)
            referee = sandbox.popen(
                [
                    sys.executable,
                    "-m",
                    "kbsweep.grader.referee.referee",
                    str(write_fd),
                    str(referee_end.fileno()),
                    str(proc_fd),
                    str(runner.pid),
                ],
                cwd=str(referee_dir),
                env=env,
                writable=[(referee_dir, str(referee_dir))],
                readonly=readonly,
                stdin=request_in,
                stdout=referee_log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd, referee_end.fileno(), proc_fd),
            )
        os.close(request_in)
        runner_end.close()
        os.close(write_fd)
        os.close(proc_fd)
        referee_end.close()
        try:
            with os.fdopen(request_out, "wb") as stdin:
                stdin.write(json.dumps(request.to_json()).encode())
        except BrokenPipeError:  # the referee died at once: its log says why
            pass
        breach = watch_both(referee, runner, how.timeout_s, how.memory_mib, sandbox.policy.disk_mib, [workdir, log_dir])
    if warm is not None:  # zygotes are reused only after a grade whose processes both ended as they should
        healthy = not breach and referee.returncode == 0 and runner.wait() == 0
        if not healthy:
            warm.stop()  # nothing of the candidate runs on while its folder is taken
        (log_dir / "candidate").mkdir(exist_ok=True)  # the record: the candidate's folder as the grade left it
        for entry in warm.home.iterdir():
            shutil.move(str(entry), str(log_dir / "candidate" / entry.name))
        for found in (judge, warm):
            zygotes.keep(found) if healthy else zygotes.discard(found)
    with os.fdopen(read_fd) as channel:
        lines = channel.read().splitlines()
    if breach:
        kind, message = breach
        return {"ok": False, "outcome": BREACH_OUTCOMES[kind], "message": f"grading process {message}"}
    if len(lines) != 1:
        tail = (log_dir / "referee.log").read_text(errors="replace").strip().splitlines()[-1:]
        detail = tail[0][:300] if tail else f"exit code {referee.returncode}"
        return {"ok": False, "outcome": Outcome.HARNESS_ERROR, "message": f"the referee died ({detail})"}
    message = json.loads(lines[0])
    runner_code = runner.returncode or 0
    signum = -runner_code if runner_code < 0 else runner_code - 128  # bwrap: 128 + signal
    if not message.get("ok") and signum > 0 and "died" in message.get("message", ""):
        cause = died_of(signum)
        if message["outcome"] == Outcome.HARNESS_ERROR:  # died before the candidate was imported: never the model's
            cause["outcome"] = Outcome.HARNESS_ERROR
        message.update(cause)
    return message


def died_of(signum: int) -> Dict[str, Any]:
    """Outcome of a runner killed by ``signum`` that kbsweep's watch did not send: SIGKILL comes from outside the
    grade (the host's OOM killer, an operator), which is never the model's result; a crash signal is."""
    name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
    if signum == signal.SIGKILL:
        return {
            "outcome": Outcome.HARNESS_ERROR,
            "message": f"the candidate's process was killed from outside the grade ({name}: the host's OOM killer?)",
        }
    return {"outcome": Outcome.RUNTIME_ERROR, "message": f"the candidate's process died of {name}"}


def watch_both(referee, runner, timeout_s: float, memory_mib: float, disk_mib: float, folders: Sequence[Path]):
    """Until the referee ends or either process passes a limit (then both are killed); returns the breach."""
    from kbsweep.sandbox.watch import POLL_S, kill

    watches = [
        Watch(referee, timeout_s, memory_mib, disk_mib, []),
        Watch(runner, timeout_s, memory_mib, disk_mib, folders),
    ]
    try:
        while referee.poll() is None:
            for watch in watches:
                found = watch.breach() if watch.proc.poll() is None else None
                if found:
                    return found
            time.sleep(POLL_S)
        return None
    finally:
        for proc in (runner, referee):
            if proc.poll() is None:
                kill(proc, settle_s=2.0)


def grading_env(hide_env: Sequence[str], device: str) -> Dict[str, str]:
    """The referee's environment (the runner's is :func:`runner_env` of it): minimal, never a secret."""
    env = minimal_env(hide_env, PYTHONPATH=str(REPO_ROOT), PYTHONDONTWRITEBYTECODE="1")
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
        # one thread for torch's and BLAS's pools, both sides: a call's work stays on the thread that called it, so
        # any other thread's CPU is the candidate's own doing (kbsweep.grader.referee.runner_cpu)
        env.update({name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    return env


def runner_env(env: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in env.items() if k != "PYTHONPATH"}  # isolated mode ignores it anyway


def warm_runner(sandbox: Sandbox, env: Dict[str, str], view: Sequence[Path], parent: Path) -> Optional[zygotes.Zygote]:
    """The runner's zygote for a single-process grade, once both sides' zygotes are ready; None (spawn cold)
    unconfined, or when a zygote fails to start (its log says why)."""
    if not sandbox.confined:
        return None
    warm = zygotes.take("runner", sandbox, runner_env(env), [REPO_ROOT / "kbsweep"], parent)
    judge = zygotes.take("referee", sandbox, env, view, parent)
    try:
        warm.started()
        judge.started()
    except OSError:
        zygotes.discard(warm, judge)
        return None
    zygotes.keep(judge)  # taken again by supervise, still warm
    return warm


def zygote_view(
    problem: Problem, device: str, world_size: int, hide_env: Sequence[str], policy: SandboxPolicy
) -> Optional[Tuple[Sandbox, Dict[str, str], List[Path]]]:
    """(sandbox, the referee's environment, its read-only view) of ``problem``'s grades, the key of the zygotes they
    fork from; None where grades spawn cold (multi-rank, unconfined)."""
    sandbox = Sandbox(policy, gpu=device == "cuda")
    if world_size > 1 or problem.spec.constraints.get("collective") or not sandbox.confined:
        return None
    return sandbox, grading_env(hide_env, device), grading_view(problem.root)


def prewarm(
    problem: Problem, device: str, world_size: int, hide_env: Sequence[str], policy: SandboxPolicy, grades: Path
) -> None:
    """Start the zygotes the grades of ``problem`` under ``grades/`` will fork from, so their imports run while
    the agent works (no-op for multi-rank grades and unconfined ones)."""
    view = zygote_view(problem, device, world_size, hide_env, policy)
    if view is not None:
        sandbox, env, readonly = view
        zygotes.prewarm("referee", sandbox, env, readonly, grades)
        zygotes.prewarm("runner", sandbox, runner_env(env), [REPO_ROOT / "kbsweep"], grades)


def referee_prober(
    problem: Problem,
    device: str,
    world_size: int,
    hide_env: Sequence[str],
    policy: SandboxPolicy,
    parent: Optional[Path] = None,
):
    """``probe(request, limit_s)`` for :func:`kbsweep.planner.validate.check_references`: the probe forked by the referee's
    zygote that ``problem``'s grades fork from (the probe sees what the referee sees), so it pays no torch import
    of its own; None where grades spawn cold. ``probe`` returns None when the zygote did not start (probe cold)."""
    view = zygote_view(problem, device, world_size, hide_env, policy)
    if view is None:
        return None

    def probe(request: str, limit_s: float) -> Optional[Tuple[int, str, str]]:
        judge = zygotes.take("referee", *view, parent)
        try:
            ran = judge.run("kbsweep.planner.validate", request, limit_s)
        except OSError:
            zygotes.discard(judge)
            return None
        zygotes.keep(judge) if ran[0] == 0 else zygotes.discard(judge)
        return ran

    return probe
