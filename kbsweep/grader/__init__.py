"""The grading stage: run a candidate in a supervised, freshly spawned, sandboxed process and score what it reports.

``grade(problem, solution, gpu, ...)`` returns one JSON-able dict: outcome, correctness, per-shape timings and
scores, baselines, evidence for the audit, and the environment it ran in. A crash, hang, OOM or illegal memory
access is a classified outcome, never an exception. The grading process runs in :mod:`kbsweep.sandbox`: it sees
kbsweep's package, the problem's files (not its solutions) and Python read-only, its candidate folder writable,
and starts from a minimal environment.
"""
from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from kbsweep import REPO_ROOT, KbsweepError, gpus
from kbsweep.config import BASELINE_TIMERS
from kbsweep.grader import zygote
from kbsweep.grader.baselines import BaselineCache, conditions, entry_key
from kbsweep.grader.failures import COMM_FINDINGS
from kbsweep.problems import Problem, asdict_spec
from kbsweep.sandbox import Sandbox, SandboxPolicy, Watch, give, grading_view, is_root, minimal_env, sandbox_uid
from kbsweep.score import score_grade, shape_speedups

BASELINE_SHARE = 0.4  # of the grade's time limit, for timing the baselines before the candidate is imported
UNSCORED_FINDINGS = ("grader_tamper", "time_disagreement", "forged_result")  # the figures themselves are not believed
BREACH_OUTCOMES = {"wall": "grade_timeout", "memory": "grade_oom", "disk": "runtime_error"}


def software_versions() -> Dict[str, str]:
    """Python, torch, Triton and CUDA versions, and the host runtime (the kernel release: a hypervisor's shows)."""
    from importlib.metadata import version

    versions = {"python": platform.python_version(), "cuda": torch_cuda(), "runtime": platform.release()}
    for name in ("torch", "triton"):
        try:
            versions[name] = version(name)
        except Exception:
            versions[name] = "absent"
    return versions


def torch_cuda() -> str:
    """``str(torch.version.cuda)``, read from torch's generated ``version.py``: importing torch costs a process
    3-6 s on a loaded 2-core host, and a single grade's orchestrator needs nothing else of it."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("torch")
    try:
        tree = ast.parse(Path(spec.origin).with_name("version.py").read_text())
        return next(str(ast.literal_eval(node.value)) for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                    and any(getattr(t, "id", None) == "cuda" for t in (node.targets if isinstance(node, ast.Assign) else [node.target])))
    except (AttributeError, OSError, SyntaxError, ValueError, StopIteration):  # a torch laid out otherwise
        import torch

        return str(torch.version.cuda)


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


RUNNER_BOOT = "import sys; sys.path.append({root!r}); from kbsweep.grader.runner import main; main()"


def supervise(
    request: Dict[str, Any],
    log_dir: Path,
    timeout_s: float,
    memory_mib: float,
    env: Dict[str, str],
    sandbox: Sandbox,
    readonly: Sequence[Path],
    warm: Optional[zygote.Zygote] = None,
) -> Dict[str, Any]:
    """Start the referee (trusted: sees ``readonly``, holds the request) and the candidate's runner (sees only
    kbsweep's package and the candidate's folder, in an isolated interpreter), each in its own sandbox, joined by
    a socket pair: forked by warm zygotes (``warm``: the runner's, whose home holds the staged candidate), else
    spawned cold. Watch both (time, memory of each process tree, disk of the candidate's folder and the logs);
    read the referee's one result message from a pipe the runner never holds."""
    log_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(request["workdir"])
    read_fd, write_fd = os.pipe()
    referee_end, runner_end = socket.socketpair()
    with open(log_dir / "grade_stdout.log", "wb") as out, open(log_dir / "grade_stderr.log", "wb") as err, \
            open(log_dir / "referee.log", "wb") as referee_log, open(os.devnull, "rb") as null:
        if warm is not None:
            judge = zygote.take("referee", sandbox, env, readonly)
            runner = warm.fork(workdir, ["fd:channel"], {"stdin": null.fileno(), "stdout": out.fileno(), "stderr": err.fileno(),
                                                          "channel": runner_end.fileno()})
            request_in, request_out = os.pipe()
            referee = judge.fork(judge.home, ["fd:result", "fd:channel"], {"stdin": request_in, "stdout": referee_log.fileno(),
                                 "stderr": referee_log.fileno(), "result": write_fd, "channel": referee_end.fileno()})
            os.close(request_in)
            stdin = os.fdopen(request_out, "wb")
        else:
            runner = sandbox.popen(
                [sys.executable, "-I", "-B", "-c", RUNNER_BOOT.format(root=str(REPO_ROOT)), str(runner_end.fileno())],
                cwd=str(workdir), env=runner_env(env), writable=[(workdir, str(workdir))], readonly=[REPO_ROOT / "kbsweep"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, pass_fds=(runner_end.fileno(),),
            )
            referee_dir = log_dir / "referee"
            referee_dir.mkdir(exist_ok=True)
            referee = sandbox.popen(
                [sys.executable, "-m", "kbsweep.grader.referee", str(write_fd), str(referee_end.fileno())],
                cwd=str(referee_dir), env=env, writable=[(referee_dir, str(referee_dir))], readonly=readonly,
                stdin=subprocess.PIPE, stdout=referee_log, stderr=subprocess.STDOUT, pass_fds=(write_fd, referee_end.fileno()),
            )
            stdin = referee.stdin
        runner_end.close()
        os.close(write_fd)
        referee_end.close()
        try:
            stdin.write(json.dumps(request).encode())
            stdin.close()
        except BrokenPipeError:  # the referee died at once: its log says why
            pass
        breach = watch_both(referee, runner, timeout_s, memory_mib, sandbox.policy.disk_mib, [workdir, log_dir])
    if warm is not None:  # zygotes are reused only after a grade whose processes both ended as they should
        healthy = not breach and referee.returncode == 0 and runner.wait() == 0
        if not healthy:
            warm.stop()  # nothing of the candidate runs on while its folder is taken
        (log_dir / "candidate").mkdir(exist_ok=True)  # the record: the candidate's folder as the grade left it
        for entry in warm.home.iterdir():
            shutil.move(str(entry), str(log_dir / "candidate" / entry.name))
        for found in (judge, warm):
            zygote.keep(found) if healthy else zygote.discard(found)
    with os.fdopen(read_fd) as channel:
        lines = channel.read().splitlines()
    if breach:
        kind, message = breach
        return {"ok": False, "outcome": BREACH_OUTCOMES[kind], "message": f"grading process {message}"}
    if len(lines) != 1:
        tail = (log_dir / "referee.log").read_text(errors="replace").strip().splitlines()[-1:]
        detail = tail[0][:300] if tail else f"exit code {referee.returncode}"
        return {"ok": False, "outcome": "harness_error", "message": f"the referee died ({detail})"}
    message = json.loads(lines[0])
    signum = -runner.returncode if (runner.returncode or 0) < 0 else (runner.returncode or 0) - 128  # bwrap: 128 + signal
    if not message.get("ok") and signum > 0 and "died" in message.get("message", ""):
        cause = died_of(signum)
        if message["outcome"] == "harness_error":  # died before the candidate was imported: never the model's
            cause["outcome"] = "harness_error"
        message.update(cause)
    return message


def died_of(signum: int) -> Dict[str, str]:
    """Outcome of a runner killed by ``signum`` that kbsweep's watch did not send: SIGKILL comes from outside the
    grade (the host's OOM killer, an operator), which is never the model's result; a crash signal is."""
    name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
    if signum == signal.SIGKILL:
        return {"outcome": "harness_error", "message": f"the candidate's process was killed from outside the grade ({name}: the host's OOM killer?)"}
    return {"outcome": "runtime_error", "message": f"the candidate's process died of {name}"}


def watch_both(referee, runner, timeout_s: float, memory_mib: float, disk_mib: float, folders: Sequence[Path]):
    """Until the referee ends or either process passes a limit (then both are killed); returns the breach."""
    from kbsweep.sandbox import POLL_S, kill

    watches = [Watch(referee, timeout_s, memory_mib, disk_mib, []), Watch(runner, timeout_s, memory_mib, disk_mib, folders)]
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
    return env


def runner_env(env: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in env.items() if k != "PYTHONPATH"}  # isolated mode ignores it anyway


def warm_runner(sandbox: Sandbox, env: Dict[str, str], view: Sequence[Path], parent: Path) -> Optional[zygote.Zygote]:
    """The runner's zygote for a single-process grade, once both sides' zygotes are ready; None (spawn cold)
    unconfined, or when a zygote fails to start (its log says why)."""
    if not sandbox.confined:
        return None
    warm = zygote.take("runner", sandbox, runner_env(env), [REPO_ROOT / "kbsweep"], parent)
    judge = zygote.take("referee", sandbox, env, view)
    try:
        warm.started()
        judge.started()
    except OSError:
        zygote.discard(warm, judge)
        return None
    zygote.keep(judge)  # taken again by supervise, still warm
    return warm


def zygote_view(problem: Problem, device: str, world_size: int, hide_env: Sequence[str], policy: SandboxPolicy):
    """(sandbox, the referee's environment, its read-only view) of ``problem``'s grades, the key of the zygotes they
    fork from; None where grades spawn cold (multi-rank, unconfined)."""
    sandbox = Sandbox(policy, gpu=device == "cuda")
    if world_size > 1 or problem.spec.constraints.get("collective") or not sandbox.confined:
        return None
    return sandbox, grading_env(hide_env, device), grading_view(problem.root)


def prewarm(problem: Problem, device: str, world_size: int, hide_env: Sequence[str], policy: SandboxPolicy, grades: Path) -> None:
    """Start the zygotes the grades of ``problem`` under ``grades/`` will fork from, so their imports run while
    the agent works (no-op for multi-rank grades and unconfined ones)."""
    view = zygote_view(problem, device, world_size, hide_env, policy)
    if view is not None:
        sandbox, env, readonly = view
        zygote.prewarm("referee", sandbox, env, readonly)
        zygote.prewarm("runner", sandbox, runner_env(env), [REPO_ROOT / "kbsweep"], grades)


def referee_prober(problem: Problem, device: str, world_size: int, hide_env: Sequence[str], policy: SandboxPolicy):
    """``probe(request, limit_s)`` for :func:`kbsweep.validate.check_references`: the probe forked by the referee's
    zygote that ``problem``'s grades fork from (the probe sees what the referee sees), so it pays no torch import
    of its own; None where grades spawn cold. ``probe`` returns None when the zygote did not start (probe cold)."""
    view = zygote_view(problem, device, world_size, hide_env, policy)
    if view is None:
        return None

    def probe(request: str, limit_s: float) -> Optional[Tuple[int, str, str]]:
        judge = zygote.take("referee", *view)
        try:
            ran = judge.run("kbsweep.validate", request, limit_s)
        except OSError:
            zygote.discard(judge)
            return None
        zygote.keep(judge) if ran[0] == 0 else zygote.discard(judge)
        return ran

    return probe


def launch_gate(timings: List[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """``constraints.single_kernel``: exactly one kernel launch per call, read from each timed shape's GPU profile.

    Returns (evidence, findings). CUDA-graph replays count the kernels inside them. A shape timed without a
    profile (a CPU grade) gives a ``launch_count_unverified`` finding, which disqualifies nothing.
    """
    evidence, findings = [], []
    for entry in timings:
        profile = entry.get("profile")
        if profile is None:
            findings.append({"kind": "launch_count_unverified", "shape": entry["shape"], "detail": "no GPU profile (CPU grade)"})
            continue
        launches, kernels = profile.get("median_launches", profile["launches_per_call"]), profile["kernels"]
        evidence.append({"shape": entry["shape"], "launches": launches, "mean_launches": profile["launches_per_call"], "kernels": kernels, "passed": launches == 1})
        if launches != 1:
            findings.append({"kind": "launch_count_gate", "shape": entry["shape"], "launches": launches, "kernels": kernels})
    return evidence, findings


def grade(
    problem: Problem,
    solution: Path,
    gpu: Any,
    roofline: Dict[str, Any],
    mode: str = "full",
    baselines: Optional[List[str]] = None,
    timeout_s: float = 1800.0,
    memory_mib: float = 0.0,
    log_dir: Optional[Path] = None,
    timing: Optional[Dict[str, Any]] = None,
    compile_mode: Optional[str] = None,
    deck_version: Optional[str] = None,
    baseline_cache: Optional[BaselineCache] = None,
    world_size: int = 1,
    hide_env: Sequence[str] = (),
    sandbox: Optional[SandboxPolicy] = None,
    timers: Optional[Sequence[str]] = None,
    zygote_home: Optional[Path] = None,
) -> Dict[str, Any]:
    """Grade one solution file. ``mode``: check (correctness only), bench or full (correctness + timing).

    A problem with a ``collective`` (the multi track), or ``world_size`` > 1, is graded at ``world_size`` ranks
    under torchrun (:mod:`kbsweep.grader.distributed`); every other grade is a referee and a runner, each confined
    by ``sandbox`` (default: :class:`~kbsweep.sandbox.SandboxPolicy`'s defaults). The processes get a minimal
    environment (never ``hide_env`` nor *_API_KEY/_TOKEN/_SECRET). ``timers``: timers of
    :data:`kbsweep.config.BASELINE_TIMERS` that time the baselines too, beside kbsweep's scored figure
    (default: ``kernelbench`` for a KernelBench problem on a GPU, where its figure means something).
    ``zygote_home``: the folder the runner's zygote keeps its home under (default: ``log_dir``'s parent); grades
    that share it share the zygote (a worker's cells, one after another)."""
    multi = world_size > 1 or bool(problem.spec.constraints.get("collective"))
    if multi:  # not at import time (``python -m kbsweep.grader.distributed`` imports this package), nor for one
        from kbsweep.grader import distributed  # process: it imports torch, which a single grade's orchestrator need not

    work = (lambda shape: distributed.multi_work(problem, shape, world_size)) if multi else problem.work
    started = time.time()  # start-up (warm zygotes or not) counts in grade_s and startup_s
    original = Path(solution).resolve()
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="kbsweep-grade-")).resolve()  # the zygotes fork in other folders
    spec = asdict_spec(problem.spec)
    shape_set = gpu.shape_set
    device = gpu.device
    env = grading_env(hide_env, device)
    confined = Sandbox(sandbox or SandboxPolicy(), gpu=device == "cuda")
    view = grading_view(problem.root)  # bundled solutions stay out of reach
    warm = warm_runner(confined, env, view, zygote_home or log_dir.parent) if not multi else None
    solution = stage_candidate(original, warm.home if warm else log_dir / "candidate")
    if warm and confined.confined and is_root():
        give([warm.home], sandbox_uid())  # staged after the zygote started: the sandbox's uid must own it
    deck_version = deck_version or problem.deck_hash()
    host_env = {**software_versions(), "host": platform.node(), "gpus": gpus.list_gpus()}
    shapes = problem.shapes(shape_set)
    keyed = [{**shape, "world": world_size} for shape in shapes] if multi else shapes  # a world size has its own baselines
    keys = {
        name: [entry_key(problem.id, problem.code_hash(), gpu.name, host_env, shape, name, compile_mode) for shape in keyed]
        for name in baselines or []
    }
    if timers is None:
        timers = ["kernelbench"] if problem.spec.kernelbench and device == "cuda" else []
    unknown = sorted(set(timers) - set(BASELINE_TIMERS))
    if unknown:
        raise KbsweepError(f"timers: unknown timer {', '.join(unknown)} (known: {', '.join(BASELINE_TIMERS)})")
    to_time = baseline_cache.missing(keys) if baseline_cache else list(keys)
    if baseline_cache and timers:  # a stored baseline timed without a timer asked for now is timed again
        to_time += [name for name in keys if name not in to_time and not all(
            set(timers) <= set((baseline_cache.get(k) or {}).get("timers") or {}) for k in keys[name])]
    request = {
        "spec": spec,
        "reference": str(problem.grader_reference.resolve()),
        "solution": str(solution),
        "workdir": str(solution.parent),
        "device": "cuda:0" if device == "cuda" else "cpu",
        "shapes": shapes,
        "mode": mode,
        "baselines": to_time if mode != "check" else [],
        "compile_mode": compile_mode,
        "l2_bytes": int(float(roofline.get("l2_mib") or 50) * 2**20),
        "timing": timing or {},
        "baseline_budget_s": BASELINE_SHARE * timeout_s,
        "secret_seed": secrets.randbits(31),
        "world_size": world_size,
        "timers": list(timers),
    }
    if multi:  # referee ranks and runner ranks, each set under its own torchrun in its own sandbox
        message = distributed.supervise_ranks(request, log_dir, timeout_s, memory_mib, env, confined, view)
    else:
        message = supervise(request, log_dir, timeout_s, memory_mib, env, confined, view, warm)
    result: Dict[str, Any] = {
        "problem": problem.id,
        "deck_version": deck_version,
        "solution": str(original),
        "mode": mode,
        "gpu": gpu.name,
        "device": device,
        "shape_set": shape_set,
        "world_size": world_size,
        "grade_s": time.time() - started,
        "timeout_s": timeout_s,
        "env": host_env,
    }
    if not message.get("ok"):
        result.update(
            outcome=message["outcome"],
            message=message["message"],
            stage=message.get("stage"),
            findings=message.get("findings", []) + ([{"kind": "forged_result"}] if message.get("forged") else []),
            evidence=message.get("evidence", {}),
            score=None,
        )
        kernelbench = message.get("kernelbench")
        if kernelbench and "median_ms" in (kernelbench.get("candidate_timing") or {}).get("candidate", {}):
            settle_baselines([kernelbench["candidate_timing"]], keys, baseline_cache, host_env, compile_mode)
            timed = kernelbench["candidate_timing"]  # no speedup where the referee's clock did not corroborate the figures
            kernelbench["speedup"] = {} if any(f["kind"] == "time_disagreement" for f in timed["findings"]) else shape_speedups(timed)
        return with_verdicts(result, kernelbench)
    worker = message["result"]
    for entry in worker["timings"]:
        entry["work"] = work(entry["shape"])
    settle_baselines(worker["timings"], keys, baseline_cache, host_env, compile_mode)
    scorer = (lambda w, spec, roof: distributed.score_multi(w, spec, roof, world_size)) if multi else score_grade
    scored = scorer(worker, problem.spec, roofline) if worker["timings"] else {"score": None, "findings": []}
    if problem.spec.constraints.get("single_kernel") and worker["timings"]:
        worker["evidence"]["launch_gate"], gate_findings = launch_gate(worker["timings"])
        worker["findings"] += gate_findings
    result.update(
        outcome="pass",
        startup_s=float(worker.get("started_at") or started) - started,  # staging, both processes up, the runner's handshake
        correctness=worker["correctness"],
        timings=worker["timings"],
        evidence=worker["evidence"],
        findings=worker["findings"] + scored.get("findings", []),
        **{k: v for k, v in scored.items() if k != "findings"},
    )
    if any(f["kind"] in UNSCORED_FINDINGS + COMM_FINDINGS for f in result["findings"]):
        result["score"] = None
    kernelbench = worker.get("kernelbench")
    if kernelbench is not None and result["score"] is not None:  # KernelBench's speedup of a pass is kbsweep's
        kernelbench["speedup"] = result.get("speedup")
    return with_verdicts(result, kernelbench)


def settle_baselines(timings: List[Dict[str, Any]], keys: Dict[str, List[str]], cache: Optional[BaselineCache],
                     host_env: Dict[str, Any], compile_mode: Optional[str]) -> None:
    """Baselines the referee timed go into the cache; the ones it did not time come from it."""
    fresh = {}
    for index, entry in enumerate(timings):
        for name in keys:
            if name in entry["baselines"]:
                if not (entry["baselines"][name] or {}).get("retry"):  # a budget skip is timed by a later grade
                    fresh[keys[name][index]] = {**(entry["baselines"][name] or {}), "conditions": conditions(host_env),
                                                   **({"compile_mode": compile_mode} if name == "compile" else {})}
            elif cache is not None:
                entry["baselines"][name] = cache.get(keys[name][index])
    if cache is not None:
        cache.store(fresh)


def with_verdicts(result: Dict[str, Any], kernelbench: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """A KernelBench problem's grade carries both verdicts: KernelBench's eval (``kernelbench``, its fields) and
    kbsweep's own (the ``outcome``: its stricter checks too); neither changes the other. Its record also holds
    each baseline's time by KernelBench's timer beside kbsweep's figure, where both timed it."""
    if kernelbench is not None:
        baselines = (result.get("timings") or [{}])[0].get("baselines") or {}
        timed = {name: {"kbsweep_median_ms": entry["median_ms"], "kernelbench": entry["timers"]["kernelbench"]}
                 for name, entry in baselines.items() if "kernelbench" in ((entry or {}).get("timers") or {})}
        if timed:
            kernelbench = {**kernelbench, "timing": timed}
        verdict = "correct" if kernelbench["correctness"] else "incorrect" if kernelbench["compiled"] else "compile_error"
        result.update(kernelbench=kernelbench, verdicts={"kernelbench": verdict, "kbsweep": result["outcome"]})
    return result

