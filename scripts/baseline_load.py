"""Whether a baseline's time depends on the host's CPU load: one solution graded with ``kbsweep grade`` (each grade
with a fresh outputs folder, so its baselines are timed, not read from a cache) while K other processes spin on the
host's CPUs, K from ``--loads`` in turn, then the first again. Per grade: its outcome, each shape's candidate and
baseline median and CI95 (and the other processes' CPUs the referee saw while it timed each baseline), the host's CPU
busy fraction over the grade (``/proc/stat``, the CPUs this script may run on) and its 1-minute load average at the end. With
``grade.timing.quiet_cpus=null`` among the overrides a baseline is timed whatever the load (how much it moves); with
the default, the referee waits for a quiet host (``grade.timing.quiet_wait_s``) or fails the grade.

    python scripts/baseline_load.py OUT.json [--problem mega/dense_decode] [--solution FILE] [--loads 0,8,16]
                                    [--grade KEY=VALUE ...] [--gpu auto]

On a CPU-only host: ``--problem demo/scale_shift --gpu cpu`` (the mechanics, not the numbers).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kbsweep.grader.referee.host_load import host_busy_s, own_cpus  # noqa: E402

BIN = Path(sys.executable).parent


def spin() -> None:
    while True:
        pass


def grade(problem: str, solution: str, gpu: str, overrides: List[str], outputs: Path) -> Dict[str, Any]:
    command = [
        str(BIN / "kbsweep"),
        "grade",
        f"problem={problem}",
        f"solution={solution}",
        f"gpu={gpu}",
        f"track={problem.split('/')[0]}",
        f"paths.outputs={outputs}",
        "--json",
        *overrides,
    ]
    shutil.rmtree(outputs, ignore_errors=True)  # no baseline cache: every baseline timed by this grade
    busy0, started = host_busy_s(), time.time()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    busy1, wall = host_busy_s(), time.time() - started
    try:
        result = json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"kbsweep grade exit {done.returncode}, no result: {done.stderr[-2000:]}") from None
    shapes = []
    for entry in result.get("timings") or []:
        row = {
            "shape": entry["shape"],
            "candidate_ms": entry["candidate"]["median_ms"],
            "candidate_ci95": entry["candidate"].get("ci95_ms"),
        }
        for name, timing in (entry.get("baselines") or {}).items():
            if timing and "median_ms" in timing:
                row[f"{name}_ms"], row[f"{name}_ci95"] = timing["median_ms"], timing.get("ci95_ms")
                row[f"{name}_host_others_cpus"] = timing.get("host_others_cpus")
        shapes.append(row)
    return {
        "wall_s": round(wall, 1),
        "rc": done.returncode,
        "outcome": result.get("outcome"),
        "message": result.get("message"),
        "score": result.get("score"),
        "cpu_busy": round((busy1 - busy0) / wall / len(own_cpus()), 3),
        "loadavg_1m": os.getloadavg()[0],
        "env": result.get("env"),
        "shapes": shapes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--problem", default="mega/dense_decode")
    parser.add_argument("--solution", default=None, help="default: the problem's solutions/triton.py")
    parser.add_argument("--gpu", default="auto")
    parser.add_argument(
        "--loads", default="0,8,16", help="spinning processes per grade, in order; the first is repeated last"
    )
    parser.add_argument("--grade", nargs="*", default=["grade.timing.max_time_s=2", "grade.baselines=[baseline]"])
    parser.add_argument("--scratch", default="/tmp/kbsweep-baseline-load")
    args = parser.parse_args()
    solution = args.solution or str(REPO / "problems" / args.problem / "solutions" / "triton.py")
    loads = [int(k) for k in args.loads.split(",")]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    out = {
        "what": f"scripts/baseline_load.py {' '.join(sys.argv[1:])}",
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "kernel": platform.release(),
        "runs": [],
    }
    for index, load in enumerate(loads + loads[:1]):
        spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(load)]
        for process in spinners:
            process.start()
        try:
            record = grade(args.problem, solution, args.gpu, args.grade, Path(args.scratch) / f"grade{index}")
        finally:
            for process in spinners:
                process.kill()
        out["runs"].append({"spinning": load, "cpus": os.cpu_count(), **record})
        Path(args.out).write_text(json.dumps(out, indent=1))  # each grade as it ends: a run cut short keeps the rest
        print(
            json.dumps(
                {k: out["runs"][-1][k] for k in ("spinning", "wall_s", "outcome", "score", "cpu_busy", "message")}
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
