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
import subprocess
import tempfile
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from kbsweep import REPO_ROOT, gpus
from kbsweep.grader.baselines import BaselineCache, entry_key
from kbsweep.problems import Problem, asdict_spec
from kbsweep.sandbox import Sandbox, SandboxPolicy, Watch, grading_view, minimal_env
from kbsweep.score import score_grade

BASELINE_SHARE = 0.4  # of the grade's time limit, for timing the baselines before the candidate is imported
BREACH_OUTCOMES = {"wall": "grade_timeout", "memory": "grade_oom", "disk": "runtime_error"}


def software_versions() -> Dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("torch", "triton"):
        try:
            from importlib.metadata import version

            versions[name] = version(name)
        except Exception:
            versions[name] = "absent"
    return versions


def stage_candidate(solution: Path, folder: Path) -> Path:
    """Copy the candidate into a fresh folder as solution.py (with its workspace's other .py files)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    if solution.name == "solution.py":
        for helper in solution.parent.glob("*.py"):
            shutil.copy2(helper, folder / helper.name)
    shutil.copy2(solution, folder / "solution.py")
    return folder / "solution.py"


def supervise(
    request: Dict[str, Any],
    log_dir: Path,
    timeout_s: float,
    memory_mib: float,
    env: Dict[str, str],
    sandbox: Sandbox,
    readonly: Sequence[Path],
) -> Dict[str, Any]:
    """Spawn the worker in ``sandbox`` (seeing ``readonly`` and its writable workdir), feed it the request, watch
    time, memory (its whole process tree) and disk, read its one result message."""
    log_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(request["workdir"])
    read_fd, write_fd = os.pipe()
    nonce = secrets.token_hex(16)
    with open(log_dir / "grade_stdout.log", "wb") as out, open(log_dir / "grade_stderr.log", "wb") as err:
        proc = sandbox.popen(
            [sys.executable, "-m", "kbsweep.grader.worker", str(write_fd)],
            cwd=str(workdir),
            env=env,
            writable=[(workdir, str(workdir))],
            readonly=readonly,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            pass_fds=(write_fd,),
        )
        os.close(write_fd)
        proc.stdin.write(json.dumps({**request, "nonce": nonce}).encode())
        proc.stdin.close()
        breach = Watch(proc, timeout_s, memory_mib, sandbox.policy.disk_mib, [workdir]).wait()
    with os.fdopen(read_fd) as channel:
        lines = channel.read().splitlines()
    if breach:
        kind, message = breach
        return {"ok": False, "outcome": BREACH_OUTCOMES[kind], "message": f"grading process {message}"}
    messages = [json.loads(line) for line in lines if line.strip()]
    if len(messages) != 1 or messages[0].get("nonce") != nonce:
        tail = (log_dir / "grade_stderr.log").read_text(errors="replace").strip().splitlines()[-1:]
        detail = tail[0][:300] if tail else f"exit code {proc.returncode}"
        if len(messages) > 1 or (messages and messages[0].get("nonce") != nonce):
            return {"ok": False, "outcome": "runtime_error", "message": "forged or repeated result message on the grader channel", "forged": True}
        return {"ok": False, "outcome": "runtime_error", "message": f"grading process died ({detail})"}
    message = messages[0]
    message.pop("nonce")
    return message


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
        launches, kernels = profile["launches_per_call"], profile["kernels"]
        evidence.append({"shape": entry["shape"], "launches": launches, "kernels": kernels, "passed": launches == 1})
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
) -> Dict[str, Any]:
    """Grade one solution file. ``mode``: check (correctness only), bench or full (correctness + timing).

    A problem with a ``collective`` (the multi track), or ``world_size`` > 1, is graded at ``world_size`` ranks
    under torchrun (:mod:`kbsweep.grader.distributed`); every other grade is one supervised process, confined by
    ``sandbox`` (default: :class:`~kbsweep.sandbox.SandboxPolicy`'s defaults). The processes get a minimal
    environment (never ``hide_env`` nor *_API_KEY/_TOKEN/_SECRET)."""
    from kbsweep.grader import distributed  # not at import time: ``python -m kbsweep.grader.distributed`` imports this package

    multi = world_size > 1 or bool(problem.spec.constraints.get("collective"))
    work = (lambda shape: distributed.multi_work(problem, shape, world_size)) if multi else problem.work
    original = Path(solution).resolve()
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="kbsweep-grade-"))
    solution = stage_candidate(Path(solution).resolve(), log_dir / "candidate")
    spec = asdict_spec(problem.spec)
    shape_set = gpu.shape_set
    device = gpu.device
    env = minimal_env(hide_env, PYTHONPATH=str(REPO_ROOT), PYTHONDONTWRITEBYTECODE="1")
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    deck_version = deck_version or problem.deck_hash()
    versions = software_versions()
    shapes = problem.shapes(shape_set)
    keyed = [{**shape, "world": world_size} for shape in shapes] if multi else shapes  # a world size has its own baselines
    keys = {
        name: [entry_key(problem.id, problem.code_hash(), gpu.name, versions, shape, name) for shape in keyed]
        for name in baselines or []
    }
    to_time = baseline_cache.missing(keys) if baseline_cache else list(keys)
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
    }
    started = time.time()
    confined = Sandbox(sandbox or SandboxPolicy(), gpu=device == "cuda")
    view = grading_view(problem.root)  # bundled solutions stay out of reach
    if multi:  # torchrun and every rank in one sandbox
        message = distributed.supervise_ranks(request, log_dir, timeout_s, memory_mib, env, confined, view)
    else:
        message = supervise(request, log_dir, timeout_s, memory_mib, env, confined, view)
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
        "env": {**versions, "host": platform.node(), "gpus": gpus.list_gpus()},
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
        return result
    worker = message["result"]
    fresh = {}
    for index, entry in enumerate(worker["timings"]):
        entry["work"] = work(entry["shape"])
        for name in keys:
            if name in entry["baselines"]:
                if not (entry["baselines"][name] or {}).get("retry"):  # a budget skip is timed by a later grade
                    fresh[keys[name][index]] = entry["baselines"][name]
            elif baseline_cache is not None:
                entry["baselines"][name] = baseline_cache.get(keys[name][index])
    if baseline_cache is not None:
        baseline_cache.store(fresh)
    scorer = (lambda w, spec, roof: distributed.score_multi(w, spec, roof, world_size)) if multi else score_grade
    scored = scorer(worker, problem.spec, roofline) if worker["timings"] else {"score": None, "findings": []}
    if problem.spec.constraints.get("single_kernel") and worker["timings"]:
        worker["evidence"]["launch_gate"], gate_findings = launch_gate(worker["timings"])
        worker["findings"] += gate_findings
    result.update(
        outcome="pass",
        correctness=worker["correctness"],
        timings=worker["timings"],
        evidence=worker["evidence"],
        findings=worker["findings"] + scored.get("findings", []),
        **{k: v for k, v in scored.items() if k != "findings"},
    )
    if any(f["kind"] in ("grader_tamper", *distributed.COMM_FINDINGS) for f in result["findings"]):
        result["score"] = None
    return result

