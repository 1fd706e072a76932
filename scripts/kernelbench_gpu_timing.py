"""KernelBench level-1 eager references timed by kbsweep's timer and by KernelBench's, side by side.

    python scripts/kernelbench_gpu_timing.py <KernelBench checkout> OUT.json [--ids 1 4 19 ...] [--budget-s 1500]
                                             [--per-problem-s 300] [--device cuda|cpu]

Each problem is one full grade of its reference as the candidate (``kbsweep.grader.grade``, eager baseline only,
``timers=["kernelbench"]``), run in a child process of its own with a time limit, so one problem that hangs or
crashes costs only itself. The eager baseline is timed in the referee by kbsweep's timer (the scored figure:
median of back-to-back calls, L2 flushed by a read, rotating inputs) and by KernelBench's
``time_execution_with_cuda_event`` as its ``measure_ref_program_time`` runs it (mean of 100 trials after 5
warm-ups and 1 discarded, a 256 MiB write before each; :func:`kbsweep.grader.referee.reference_timers.time_kernelbench`).
Problems are skipped, and say so, once ``--budget-s`` is spent. OUT.json is rewritten after every problem.
``--device cpu`` runs the same path at the CPU smoke sizes (KernelBench's loop with perf_counter): a dry run.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kbsweep.config.kernelbench import kernelbench_names, materialize_all  # noqa: E402
from kbsweep.config.schema import load_gpu  # noqa: E402

DEFAULT_IDS = [
    1,
    4,
    19,
    23,
    33,
    36,
    40,
    47,
    63,
    88,
]  # matmul, matvec, elementwise, softmax, norms, reduction, conv, GELU
QUICK_CPU_TIMING = {"min_runs": 2, "max_runs": 10, "max_time_s": 0.5}


def one(root: Path, device: str, timeout_s: float) -> Dict[str, Any]:
    """(in the child) The grade of ``root``'s reference as candidate; the two figures of its eager baseline."""
    from gpu_common import SANDBOX, SANDBOX_NOTE

    from kbsweep.config.problems import load_problem
    from kbsweep.grader import grade
    from kbsweep.grader.request import GradeRequest
    from kbsweep.score.roofline import load_roofline

    repo = Path(__file__).resolve().parent.parent
    cuda = device == "cuda"
    gpu = load_gpu("h200" if cuda else "cpu")
    roofline = load_roofline([str(repo / "roofline_specs")], gpu.roofline)
    problem = load_problem(root, "kernelbench")
    result = grade(
        GradeRequest(
            problem,
            root / "solutions/reference.py",
            gpu,
            roofline,
            mode="full",
            baselines=["eager"],
            timeout_s=timeout_s,
            timing=None if cuda else QUICK_CPU_TIMING,
            timers=["kernelbench"],
            sandbox=SANDBOX,
        )
    ).to_json()
    record = {
        "outcome": result["outcome"],
        "verdicts": result.get("verdicts"),
        "grade_s": result["grade_s"],
        "sandbox": SANDBOX_NOTE,
        "gpus": result["env"].get("gpus"),
        "shape": (result.get("timings") or [{}])[0].get("shape"),
    }
    if result["outcome"] != "pass":
        return {**record, "error": result.get("message")}
    eager = result["timings"][0]["baselines"]["eager"]
    figures = (result.get("kernelbench") or {}).get("timing", {}).get("eager")
    if not figures:
        return {**record, "error": f"eager baseline not timed: {json.dumps(eager)[:300]}"}
    kb = figures["kernelbench"]
    return {
        **record,
        "kbsweep": {k: eager[k] for k in ("median_ms", "mean_ms", "iqr_ms", "min_ms", "runs", "mode")},
        "kernelbench": kb,
        "kernelbench_mean_over_kbsweep_median": kb["mean_ms"] / eager["median_ms"],
        "candidate_median_ms": result["timings"][0]["candidate"]["median_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a KernelBench checkout (holds KernelBench/level1)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--ids", type=int, nargs="+", default=DEFAULT_IDS, help="level-1 problem numbers")
    parser.add_argument("--budget-s", type=float, default=1500.0, help="for all problems; the rest are skipped")
    parser.add_argument("--per-problem-s", type=float, default=300.0)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args()
    folder = (args.checkout / "KernelBench" / "level1").resolve()
    by_id = {int(name.split("_", 1)[0]): name for name in kernelbench_names(folder) if name.split("_", 1)[0].isdigit()}
    missing = [i for i in args.ids if i not in by_id]
    if missing:
        sys.exit(f"{folder}: no level-1 problem numbered {', '.join(map(str, missing))}")
    names = [by_id[i] for i in args.ids]
    began = time.perf_counter()
    roots = materialize_all(folder, names)
    record: Dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "device": args.device,
        "folder": str(folder),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "problems": {},
    }
    for name, root in zip(names, roots):
        left = args.budget_s - (time.perf_counter() - began)
        if left < 10:
            record["problems"][name] = {"skipped": f"the {args.budget_s:.0f} s budget was spent"}
        else:
            limit = min(args.per_problem_s, left)
            started = time.perf_counter()
            try:
                proc = subprocess.run(
                    [sys.executable, __file__, "--one", str(root), args.device, str(limit)],
                    capture_output=True,
                    text=True,
                    timeout=limit + 30,
                )
                lines = proc.stdout.strip().splitlines()
                entry = (
                    json.loads(lines[-1])
                    if proc.returncode == 0 and lines
                    else {"error": (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1][:300]}
                )
            except subprocess.TimeoutExpired:
                entry = {"error": f"over the {limit:.0f} s limit"}
            record["problems"][name] = {**entry, "wall_s": time.perf_counter() - started}
        print(name, json.dumps(record["problems"][name])[:300], flush=True)
        args.out.write_text(json.dumps(record, indent=1))
    args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(one(Path(sys.argv[2]), sys.argv[3], float(sys.argv[4])), default=str))
    else:
        main()
