"""Side by side: the wall time of one CPU grade of the demo problem under two checkouts of kbsweep (e.g. before and
after a grader change), interleaved, each grade in a fresh interpreter.

    python scripts/grade_cost.py OLD_REPO NEW_REPO OUT.json [REPEATS]

Grades problems/demo/scale_shift's Triton solution in check mode and in full mode (eager baseline, the tests'
quick timing), sandbox as each checkout's default, and writes every wall time and the medians.
"""
from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

GRADE = """
import sys, time
from pathlib import Path
from kbsweep.config.schema import load_gpu
from kbsweep.grader import grade
from kbsweep.grader.request import GradeRequest
from kbsweep.config.problems import load_problem
from kbsweep.score.roofline import load_roofline
repo = Path(sys.argv[1])
cpu = load_gpu("cpu")
problem = load_problem(repo / "problems/demo/scale_shift", "demo")
started = time.perf_counter()
result = grade(GradeRequest(problem, problem.root / "solutions/triton.py", cpu, load_roofline([str(repo / "roofline_specs")], "cpu"),
                            mode=sys.argv[2], baselines=["eager"], timing={"min_runs": 2, "max_runs": 10, "max_time_s": 0.5}, timeout_s=300)).to_json()
assert result["outcome"] == "pass", result.get("message")
print(time.perf_counter() - started)
"""


def one(repo: Path, mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", GRADE, str(repo), mode], cwd=repo, env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(old: Path, new: Path, out: Path, repeats: int) -> None:
    times = {f"{name}_{mode}": [] for name in ("old", "new") for mode in ("check", "full")}
    for _ in range(repeats):
        for mode in ("check", "full"):
            for name, repo in (("old", old), ("new", new)):
                times[f"{name}_{mode}"].append(one(repo, mode))
                print(name, mode, times[f"{name}_{mode}"][-1], flush=True)
    medians = {key: statistics.median(values) for key, values in times.items()}
    ratios = {mode: medians[f"new_{mode}"] / medians[f"old_{mode}"] for mode in ("check", "full")}
    record = {"date": time.strftime("%Y-%m-%d"), "host": platform.node(), "cpus": __import__("os").cpu_count(), "old": str(old), "new": str(new),
              "seconds": times, "medians": medians, "new_over_old": ratios}
    out.write_text(json.dumps(record, indent=1))
    print(json.dumps({"medians": medians, "new_over_old": ratios}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), Path(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 3)
