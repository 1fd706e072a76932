"""One grade: run a candidate in a supervised, freshly spawned, sandboxed process and score what it reports.

``grade(request)`` (a :class:`~kbsweep.grader.request.GradeRequest`) returns one
:class:`~kbsweep.grader.result.GradeResult` (stored as JSON): outcome, correctness, per-shape timings and scores,
baselines, evidence for the audit, and the environment it ran in. A crash, hang, OOM or illegal memory
access is a classified outcome, never an exception. The grading process runs in :mod:`kbsweep.sandbox.confine`: it sees
kbsweep's package, the problem's files (not its solutions) and Python read-only, its candidate folder writable,
and starts from a minimal environment. ``from kbsweep.grader import grade`` reaches it (the package forwards it).
"""

from __future__ import annotations

import functools
import platform
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from kbsweep.config import gpus
from kbsweep.config.problems import asdict_spec
from kbsweep.config.schema import BASELINE_TIMERS
from kbsweep.errors import KbsweepError
from kbsweep.grader import ncu, processes, profile_summary
from kbsweep.grader.baselines import entry_key, settle
from kbsweep.grader.processes import Supervision, grading_env, warm_runner
from kbsweep.grader.referee.request import RefereeRequest
from kbsweep.grader.request import GradeRequest
from kbsweep.grader.result import GradeResult
from kbsweep.grader.shared.failures import COMM_FINDINGS
from kbsweep.grader.staging import stage_candidate
from kbsweep.outcomes import Outcome
from kbsweep.sandbox.confine import Sandbox, SandboxPolicy, give, grading_view, is_root, sandbox_uid
from kbsweep.score.roofline import gpumode_ranking, score_grade, shape_speedups

BASELINE_SHARE = 0.4  # of the grade's time limit, for timing the baselines before the candidate is imported
# the figures themselves are not believed, or they are not the candidate's own kernels' work
UNSCORED_FINDINGS = ("grader_tamper", "time_disagreement", "forged_result", "evidence_mismatch", "no_kernel")


@functools.lru_cache(maxsize=None)
def software_versions() -> Dict[str, str]:
    """Python, torch, Triton and CUDA versions, and the host runtime (the kernel release: a hypervisor's shows);
    read once a process (reading every package's metadata per grade took 1.8 s of py-spy samples over a 100-cell demo
    sweep). Callers copy it."""
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
    if spec is not None and spec.origin is not None:
        try:
            tree = ast.parse(Path(spec.origin).with_name("version.py").read_text())
            return next(
                str(ast.literal_eval(node.value))
                for node in tree.body
                if isinstance(node, (ast.Assign, ast.AnnAssign))
                and node.value is not None  # a bare annotation (``cuda: Optional[str]``) declares, never sets
                and any(
                    getattr(t, "id", None) == "cuda"
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                )
            )
        except (OSError, SyntaxError, ValueError, StopIteration):  # a torch laid out otherwise
            pass
    import torch

    return str(torch.version.cuda)


def launch_gate(timings: List[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """``constraints.single_kernel``: exactly one kernel launch per call, read from each timed shape's GPU profile.

    Returns (evidence, findings). CUDA-graph replays count the kernels inside them. A shape timed without a
    profile (a CPU grade) gives a ``launch_count_unverified`` finding, which disqualifies nothing.
    """
    evidence, findings = [], []
    for entry in timings:
        profile = entry.get("profile")
        if profile is None:
            findings.append(
                {"kind": "launch_count_unverified", "shape": entry["shape"], "detail": "no GPU profile (CPU grade)"}
            )
            continue
        launches, kernels = profile.get("median_launches", profile["launches_per_call"]), profile["kernels"]
        evidence.append(
            {
                "shape": entry["shape"],
                "launches": launches,
                "mean_launches": profile["launches_per_call"],
                "kernels": kernels,
                "passed": launches == 1,
            }
        )
        if launches != 1:
            findings.append(
                {"kind": "launch_count_gate", "shape": entry["shape"], "launches": launches, "kernels": kernels}
            )
    return evidence, findings


def grade(request: GradeRequest) -> GradeResult:
    """Grade one solution file as ``request`` asks (:class:`~kbsweep.grader.request.GradeRequest`).

    A problem with a ``collective`` (the multi track), or ``world_size`` > 1, is graded at ``world_size`` ranks
    under torchrun (:mod:`kbsweep.grader.distributed`); every other grade is a referee and a runner
    (:mod:`kbsweep.grader.processes`), each confined by the request's sandbox. The processes get a minimal
    environment (never ``hide_env`` nor *_API_KEY/_TOKEN/_SECRET)."""
    problem, gpu, world_size, cache = request.problem, request.gpu, request.world_size, request.baseline_cache
    multi = world_size > 1 or bool(problem.spec.constraints.get("collective"))
    if multi:  # not at import time, nor for one process: it imports torch, which a single grade's orchestrator need not
        from kbsweep.grader import distributed

    work = (lambda shape: distributed.multi_work(problem, shape, world_size)) if multi else problem.work
    started = time.time()  # start-up (warm zygotes or not) counts in grade_s and startup_s
    original = Path(request.solution).resolve()
    log_dir = Path(
        request.log_dir or tempfile.mkdtemp(prefix="kbsweep-grade-")
    ).resolve()  # the zygotes fork in other folders
    device = gpu.device
    env = grading_env(request.hide_env, device)
    confined = Sandbox(request.sandbox or SandboxPolicy(), gpu=device == "cuda")
    view = grading_view(problem.root)  # bundled solutions stay out of reach
    warm = warm_runner(confined, env, view, request.zygote_home or log_dir.parent) if not multi else None
    solution = stage_candidate(original, warm.home if warm else log_dir / "candidate")
    if warm and confined.confined and is_root():
        give([warm.home], sandbox_uid())  # staged after the zygote started: the sandbox's uid must own it
    deck_version = request.deck_version or problem.deck_hash()
    found = gpus.list_gpus()
    # graded_on: the GPUs the grade's processes see (device_lock pins them), what ran it beside gpu.name's nvml_names
    host_env = {
        **software_versions(),
        "host": platform.node(),
        "gpus": found,
        "graded_on": gpus.pool_devices(found) if device == "cuda" else [],
    }
    held_out = [dict(shape) for shape in request.held_out_shapes]  # mode full only (GradeRequest.of)
    shapes = problem.shapes(gpu.shape_set)
    if request.mode == "profile":  # one public shape: the first of the set a check or benchmark grades
        shapes = shapes[:1]
    shapes = shapes + held_out  # graded alike; told apart only here, in the orchestrator
    keyed = (
        [{**shape, "world": world_size} for shape in shapes] if multi else shapes
    )  # a world size has its own baselines
    deck = problem.code_hash()
    keys = {
        name: [entry_key(problem.id, deck, gpu.name, host_env, shape, name, request.compile_mode) for shape in keyed]
        for name in request.baselines
    }
    parts = {"problem": problem.id, "deck": deck, "gpu": gpu.name, "shapes": keyed}  # what each key is the timing of
    timers = request.timers
    if timers is None:
        timers = ["kernelbench"] if problem.spec.kernelbench and device == "cuda" else []
    unknown = sorted(set(timers) - set(BASELINE_TIMERS))
    if unknown:
        raise KbsweepError(f"timers: unknown timer {', '.join(unknown)} (known: {', '.join(BASELINE_TIMERS)})")
    to_time = cache.missing(keys) if cache else list(keys)
    if cache and timers:  # a stored baseline timed without a timer asked for now is timed again
        to_time += [
            name
            for name in keys
            if name not in to_time
            and not all(set(timers) <= set((cache.get(k) or {}).get("timers") or {}) for k in keys[name])
        ]
    referee_request = RefereeRequest(
        spec=asdict_spec(problem.spec),
        reference=str(problem.grader_reference.resolve()),
        solution=str(solution),
        workdir=str(solution.parent),
        device="cuda:0" if device == "cuda" else "cpu",
        shapes=shapes,
        mode=request.mode,
        baselines=to_time if request.mode != "check" else [],
        compile_mode=request.compile_mode,
        l2_bytes=int(float(request.roofline.get("l2_mib") or 50) * 2**20),
        timing=request.timing or {},
        baseline_budget_s=BASELINE_SHARE * request.timeout_s,
        secret_seed=secrets.randbits(31),
        world_size=world_size,
        timers=list(timers),
        own_kernels=request.own_kernels if request.own_kernels is not None else not problem.spec.kernelbench,
    )
    how = Supervision(log_dir, request.timeout_s, request.memory_mib, env, confined, view)
    if multi:  # referee ranks and runner ranks, each set under its own torchrun in its own sandbox
        message = distributed.supervise_ranks(referee_request, how)
    else:
        message = processes.supervise(referee_request, how, warm)
    result = GradeResult(
        problem.id,
        deck_version,
        str(original),
        request.mode,
        gpu.name,
        device,
        gpu.shape_set,
        world_size,
        time.time() - started,
        request.timeout_s,
        host_env,
        Outcome(message["outcome"]) if not message.get("ok") else Outcome.PASS,
    )
    if not message.get("ok"):
        result.message, result.stage = message["message"], message.get("stage")
        result.findings = message.get("findings", []) + ([{"kind": "forged_result"}] if message.get("forged") else [])
        result.evidence = message.get("evidence", {})
        kernelbench = message.get("kernelbench")
        if kernelbench and "median_ms" in (kernelbench.get("candidate_timing") or {}).get("candidate", {}):
            settle([kernelbench["candidate_timing"]], keys, cache, host_env, request.compile_mode, parts)
            timed = kernelbench[
                "candidate_timing"
            ]  # no speedup where the referee's clock did not corroborate the figures
            kernelbench["speedup"] = (
                {} if any(f["kind"] == "time_disagreement" for f in timed["findings"]) else shape_speedups(timed)
            )
        return with_verdicts(result, kernelbench)
    worker = message["result"]
    for entry in worker["timings"]:
        entry["work"] = work(entry["shape"])
        if entry["shape"] in held_out:
            entry["held_out"] = True
    settle(worker["timings"], keys, cache, host_env, request.compile_mode, parts)
    scorer = (lambda w, spec, roof: distributed.score_multi(w, spec, roof, world_size)) if multi else score_grade
    scored = scorer(worker, problem.spec, request.roofline) if worker["timings"] else {"score": None, "findings": []}
    if problem.spec.constraints.get("single_kernel") and worker["timings"]:
        worker["evidence"]["launch_gate"], gate_findings = launch_gate(worker["timings"])
        worker["findings"] += gate_findings
    result.startup_s = (
        float(worker.get("started_at") or started) - started
    )  # staging, both processes up, the runner's handshake
    result.correctness, result.timings, result.evidence = worker["correctness"], worker["timings"], worker["evidence"]
    result.findings = worker["findings"] + scored["findings"]
    result.score, result.basis = scored["score"], scored.get("basis")
    result.shapes, result.speedup = scored.get("shapes", []), scored.get("speedup", {})
    for shape, entry in zip(result.shapes, worker["timings"]):
        shape.held_out = entry.get("held_out", False)
    voided = any(f["kind"] in UNSCORED_FINDINGS + COMM_FINDINGS for f in result.findings)
    if voided:
        result.score = None
    if request.mode == "profile":  # a look for the agent, never a score
        result.score = None
        result.profile = profile_summary.summary(
            result,
            worker.get("profile"),
            request.roofline,
            problem.spec.regime,
            ncu.speed_of_light(request, shapes[0], original, confined, env, view),
        )
    if held_out and result.score is not None:  # the same scorer over each part: what the agent saw, what it never did
        result.score_public, result.score_held_out = (
            scorer(
                {**worker, "timings": [e for e in worker["timings"] if e.get("held_out", False) is part]},
                problem.spec,
                request.roofline,
            )["score"]
            for part in (False, True)
        )
    if problem.spec.gpumode and result.shapes and not voided and request.mode != "profile":
        # their leaderboard's figure from kbsweep's timings, beside kbsweep's score (which a CPU grade may lack)
        result.gpumode = gpumode_ranking(result.shapes, problem.spec.gpumode.get("ranking_by"))
    kernelbench = worker.get("kernelbench")
    if kernelbench is not None and result.score is not None:  # KernelBench's speedup of a pass is kbsweep's
        kernelbench["speedup"] = result.speedup
    return with_verdicts(result, kernelbench)


def with_verdicts(result: GradeResult, kernelbench: Optional[Dict[str, Any]]) -> GradeResult:
    """A KernelBench problem's grade carries both verdicts: KernelBench's eval (``kernelbench``, its fields) and
    kbsweep's own (the ``outcome``: its stricter checks too); neither changes the other. Its record also holds
    each baseline's time by KernelBench's timer beside kbsweep's figure, where both timed it."""
    if kernelbench is not None:
        baselines = (result.timings or [{}])[0].get("baselines") or {}
        timed = {
            name: {"kbsweep_median_ms": entry["median_ms"], "kernelbench": entry["timers"]["kernelbench"]}
            for name, entry in baselines.items()
            if "kernelbench" in ((entry or {}).get("timers") or {})
        }
        if timed:
            kernelbench = {**kernelbench, "timing": timed}
        verdict = (
            "correct"
            if kernelbench["correctness"]
            else Outcome.INCORRECT.value
            if kernelbench["compiled"]
            else Outcome.COMPILE_ERROR.value
        )
        result.kernelbench, result.verdicts = kernelbench, {"kernelbench": verdict, "kbsweep": result.outcome.value}
    return result
