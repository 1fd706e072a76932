"""Start-up of a grade: from ``grade()`` being called until the referee starts its work with the runner up (the
result's ``startup_s``), cold (every zygote closed first: both processes spawned and importing torch, as before
zygotes) and warm (forked from the zygotes the previous grade left), interleaved, in one process.

    python scripts/grade_startup.py OUT.json [REPEATS]

Grades problems/demo/scale_shift's Triton solution in check mode on CPU under bubblewrap.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch  # noqa: F401 - the orchestrator's own import is not a grading process's start-up

from kbsweep import REPO_ROOT
from kbsweep.config.problems import load_problem
from kbsweep.config.schema import load_gpu
from kbsweep.grader import grade, zygotes
from kbsweep.grader.request import GradeRequest
from kbsweep.score.roofline import load_roofline


def main(out: Path, repeats: int) -> None:
    cpu = load_gpu("cpu")
    problem = load_problem(REPO_ROOT / "problems/demo/scale_shift", "demo")
    roofline = load_roofline([str(REPO_ROOT / "roofline_specs")], "cpu")
    grades = Path(tempfile.mkdtemp(prefix="kbsweep-startup-"))
    record = {"cold": [], "warm": [], "cold_grade_s": [], "warm_grade_s": []}
    for i in range(repeats):
        for mode in ("cold", "warm"):
            if mode == "cold":
                zygotes.close_all()
            result = grade(
                GradeRequest(
                    problem,
                    problem.root / "solutions/triton.py",
                    cpu,
                    roofline,
                    mode="check",
                    timeout_s=300,
                    log_dir=grades / f"{mode}-{i}",
                )
            ).to_json()
            assert result["outcome"] == "pass", result.get("message")
            record[mode].append(result["startup_s"])
            record[f"{mode}_grade_s"].append(result["grade_s"])
            print(mode, round(result["startup_s"], 3), round(result["grade_s"], 2), os.getloadavg(), flush=True)
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_after": os.getloadavg(),
        "seconds": record,
        "medians": {k: statistics.median(v) for k, v in record.items()},
    }
    out.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["medians"], indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 5)
