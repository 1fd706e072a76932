"""Runs on a GPU machine: the multi track end to end (docs/multi.md), one call, a table at the end.

    python3 scripts/multi_gpu_check.py OUT_DIR [--world N] [--budget-s 330]

At world size 1 on the first GPU, for every problem: the p2p example graded in full (correctness, slowest-rank
timing, NCCL reference timed beside it, score) and the reference itself as the candidate (check mode: it must
pass and be caught by the profiler gate). With N > 1 GPUs visible (or --world N): the same at N ranks plus the
rank-symmetric shortcut (it must fail). Grades run one after another; one that would start past the budget
is skipped and listed as such. One JSON per grade under OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from gpu_common import GPU, REPO, ROOFLINE, SANDBOX, SANDBOX_NOTE

from kbsweep.config.problems import load_problem
from kbsweep.grader import grade
from kbsweep.grader.request import GradeRequest

PROBLEMS = ["allreduce_residual", "gemm_allreduce", "allgather_gemm", "ring_attention", "moe_dispatch_combine"]
TIMING = {"min_runs": 5, "max_runs": 30, "rel_err": 0.01, "max_time_s": 0.5}
EXPECT = {"p2p": "pass, no collective", "reference": "pass + c10d_collective", "wrong": "incorrect"}


def reference_solution(problem, folder: Path) -> Path:
    """The reference as a candidate (ModelNew = Model): correct, and it calls NCCL."""
    path = folder / "candidates" / problem.name / "solution.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(problem.reference.read_text() + "\n\nModelNew = Model\n")
    return path


def verdict(label: str, result: dict) -> str:
    kinds = {f["kind"] for f in result.get("findings", [])}
    caught = bool(kinds & {"c10d_collective", "nccl_kernel"})
    ok = {
        "p2p": result["outcome"] == "pass" and not caught,
        "reference": result["outcome"] == "pass" and caught,
        "wrong": result["outcome"] == "incorrect",
    }[label]
    return "ok" if ok else "UNEXPECTED"


def row(world: int, name: str, label: str, result: dict) -> str:
    kinds = sorted({f["kind"] for f in result.get("findings", [])})
    shapes = result.get("shapes") or []
    ms = " ".join(f"{s['ms']:.3f}" for s in shapes) or "-"
    eager = " ".join(f"{s['speedup'].get('eager', 0):.2f}" for s in shapes) or "-"
    bus = " ".join(f"{s['busbw_gbps']:.3g}" if s.get("busbw_gbps") else "-" for s in shapes) or "-"
    score = f"{result['score']:.3g} ({result.get('basis')})" if result.get("score") is not None else "-"
    message = (result.get("message") or "")[:90]
    return (
        f"| {world} | {name} | {label} | {verdict(label, result)} | {result['outcome']} | {score} | {ms} | {bus} | {eager} "
        f"| {', '.join(kinds) or '-'} | {result.get('grade_s', 0):.0f} | {message} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--world", type=int, default=torch.cuda.device_count())
    parser.add_argument("--budget-s", type=float, default=330.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        f"torch {torch.__version__}, {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}; {SANDBOX_NOTE}",
        flush=True,
    )
    problems = {name: load_problem(REPO / "problems/multi" / name, "multi") for name in PROBLEMS}
    plan = [(1, name, "p2p", "full") for name in PROBLEMS] + [(1, name, "reference", "check") for name in PROBLEMS]
    if args.world > 1:
        plan += [
            (args.world, name, label, mode)
            for name in PROBLEMS
            for label, mode in (("p2p", "full"), ("reference", "check"), ("wrong", "check"))
        ]
    began, rows, skipped = time.time(), [], []
    for world, name, label, mode in plan:
        left = args.budget_s - (time.time() - began)
        if left < 30:
            skipped.append(f"{world} {name} {label}")
            continue
        problem = problems[name]
        solution = (
            reference_solution(problem, args.out)
            if label == "reference"
            else problem.root / "solutions" / f"{label}.py"
        )
        result = grade(
            GradeRequest(
                problem,
                solution,
                GPU,
                ROOFLINE,
                mode=mode,
                sandbox=SANDBOX,
                baselines=["eager"] if mode == "full" else [],
                timeout_s=left,
                timing=TIMING,
                world_size=world,
                log_dir=args.out / "logs" / f"{world}-{name}-{label}",
            )
        ).to_json()
        (args.out / f"{world}-{name}-{label}.json").write_text(json.dumps(result, indent=1, default=str))
        rows.append(row(world, name, label, result))
        print(f"[{time.time() - began:5.0f} s] {rows[-1]}", flush=True)
    print(
        "\n| world | problem | solution | expected | outcome | score | ms per shape (slowest rank) | busbw GB/s "
        "| speedup vs NCCL ref | findings | grade s | message |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(
        f"\nexpected: {EXPECT}; total {time.time() - began:.0f} s"
        + (f"; skipped (budget): {', '.join(skipped)}" if skipped else "")
    )


if __name__ == "__main__":
    main()
