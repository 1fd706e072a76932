"""Grade KernelBench levels on CPU through kbsweep: per problem, the reference as candidate and a wrong solution
(the reference + 1), each by ``kbsweep grade ... gpu=cpu`` in its own process, as a user runs it.

    python scripts/kernelbench_cpu_run.py <KernelBench>/KernelBench OUT.json [--levels level1 level2] [--sample N --seed S]

``--one-process``: a problem's two grades in one process instead (``kbsweep.grade`` twice, as the Python API runs
it), so the second forks from the zygotes the first started, as a sweep cell's grades do; its record's
``process_s`` is the whole process, start-up included. ``--sample N`` grades N problems per level drawn at random
(seeded); without it, every problem. Problems are
graded in a random order (seeded), the levels taking turns, so a run stopped early has graded a random sample
of each level. ``--skip EARLIER.json ...``: leave out the problems an earlier run's output graded (both
solutions), so a run cut short can be finished; ``--problems LEVEL/NAME ...``: these problems only.
``--summarize A.json B.json ...``: no grading; the summary of these outputs' grades together (OUT.json is
written with it). ``--jobs N`` grades N problems at once (each problem's two grades one after the other): more
problems an hour, each slower. OUT.json is rewritten after every grade (a long run can be read, or stopped, at
any point): each grade's wall time, the 1-minute load average before and after it, exit code, outcome, both
verdicts, message and the referee's seconds and forward calls per stage, and per level and solution the count of
each outcome and the medians.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List

from kbsweep.config.kernelbench import kernelbench_names, materialize_all

SOLUTIONS = ("reference", "wrong")


def grade_one(folder: Path, name: str, solution: Path, outputs: Path, timeout_s: float) -> Dict[str, Any]:
    """One ``kbsweep grade`` in a fresh process; what it printed, with its wall time."""
    command = [
        sys.executable,
        "-m",
        "kbsweep.cli",
        "grade",
        "track=kernelbench",
        f"track.problems_dir={folder}",
        f"problem=kernelbench/{name}",
        f"solution={solution}",
        "gpu=cpu",
    ]
    started, load = time.perf_counter(), os.getloadavg()[0]
    try:
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "KBSWEEP_OUTPUTS": str(outputs)},
        )
    except subprocess.TimeoutExpired:
        return {
            "wall_s": time.perf_counter() - started,
            "load": [load, os.getloadavg()[0]],
            "rc": None,
            "outcome": "script_timeout",
        }
    record: Dict[str, Any] = {
        "wall_s": time.perf_counter() - started,
        "load": [load, os.getloadavg()[0]],
        "rc": proc.returncode,
    }
    try:
        result = json.loads(proc.stdout)
    except ValueError:  # exit 2 (a problem error) or 1: the one line on stderr says why
        return {
            **record,
            "outcome": f"exit_{proc.returncode}",
            "message": (proc.stderr.strip().splitlines() or [""])[-1][:300],
        }
    evidence = result.get("evidence") or {}
    return {
        **record,
        "outcome": result["outcome"],
        "verdicts": result.get("verdicts"),
        "grade_s": result.get("grade_s"),
        "startup_s": result.get("startup_s"),
        "message": (result.get("message") or "")[:300],
        "forward_calls": evidence.get("probe", {}).get("calls"),
        "stages": evidence.get("stages"),
    }


def grade_problem(
    folder: Path, name: str, solutions: List[Path], outputs: Path, timeout_s: float
) -> List[Dict[str, Any]]:
    """``solutions`` graded one after the other in one fresh process (``kbsweep.grade``); a record per grade, each
    with its own wall time and ``process_s``, the process's."""
    child = (
        "import json, sys, time\nimport kbsweep\nfor solution in sys.argv[3:]:\n    t = time.perf_counter()\n"
        "    try:\n        result = kbsweep.grade(f'kernelbench/{sys.argv[2]}', solution, 'track=kernelbench', "
        "f'track.problems_dir={sys.argv[1]}', 'gpu=cpu').result\n"
        "    except kbsweep.KbsweepError as exc:\n        result = {'outcome': 'exit_2', 'message': str(exc)}\n"
        "    print(json.dumps({'wall_s': time.perf_counter() - t, 'result': result}, default=str), flush=True)\n"
    )
    started, load = time.perf_counter(), os.getloadavg()[0]
    try:
        proc = subprocess.run(
            [sys.executable, "-c", child, str(folder), name, *map(str, solutions)],
            capture_output=True,
            text=True,
            timeout=timeout_s * len(solutions),
            env={**os.environ, "KBSWEEP_OUTPUTS": str(outputs)},
        )
        lines, rc = proc.stdout.splitlines(), proc.returncode
    except subprocess.TimeoutExpired as exc:
        lines, rc = (exc.stdout or b"").decode().splitlines(), None
    common = {"process_s": time.perf_counter() - started, "load": [load, os.getloadavg()[0]], "rc": rc}
    records = []
    for line in lines:
        graded = json.loads(line)
        result, evidence = graded["result"], graded["result"].get("evidence") or {}
        records.append(
            {
                **common,
                "wall_s": graded["wall_s"],
                "outcome": result["outcome"],
                "verdicts": result.get("verdicts"),
                "grade_s": result.get("grade_s"),
                "startup_s": result.get("startup_s"),
                "message": (result.get("message") or "")[:300],
                "forward_calls": evidence.get("probe", {}).get("calls"),
                "stages": evidence.get("stages"),
            }
        )
    return records + [{**common, "wall_s": None, "outcome": "script_timeout" if rc is None else f"exit_{rc}"}] * (
        len(solutions) - len(records)
    )


def median(values) -> Any:
    known = [v for v in values if v is not None]  # a grade cut off by the script's timeout has no wall time
    return statistics.median(known) if known else None


def summary(grades: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per level (and all levels, when more than one) and solution: outcome counts (kbsweep's, KernelBench's) and
    the median wall time; per problem too, with the median 1-minute load before its first grade."""
    out: Dict[str, Any] = {}
    levels = sorted({g["level"] for g in grades})
    for level in levels + (["all"] if len(levels) > 1 else []):
        mine = [g for g in grades if level in ("all", g["level"])]
        entry: Dict[str, Any] = {}
        for solution in SOLUTIONS:
            these = [g for g in mine if g["solution"] == solution]
            if these:
                entry[solution] = {
                    "grades": len(these),
                    "kbsweep": dict(Counter(g["outcome"] for g in these)),
                    "kernelbench": dict(Counter((g.get("verdicts") or {}).get("kernelbench", "none") for g in these)),
                    "median_wall_s": median(g["wall_s"] for g in these),
                }
        per_problem, load = Counter(), {}
        for g in mine:  # one process for both grades: its own wall time, start-up included
            key = g["level"], g["problem"]
            per_problem[key] = g["process_s"] if "process_s" in g else per_problem[key] + (g["wall_s"] or 0)
            load.setdefault(key, g["load"][0])
        entry["median_wall_s_per_grade"] = median(g["wall_s"] for g in mine)
        entry["median_wall_s_per_problem_both_grades"] = statistics.median(per_problem.values())
        entry["problems_within_60_s"] = sum(seconds <= 60 for seconds in per_problem.values())
        entry["median_load_1min"] = statistics.median(load.values())
        out[level] = entry
    return out


def already_graded(outputs: List[Path]) -> set:
    """(level, problem) of every problem these earlier outputs hold both solutions' grades of."""
    solutions: Dict[tuple, set] = {}
    for path in outputs:
        for grade in json.loads(path.read_text())["grades"]:
            solutions.setdefault((grade["level"], grade["problem"]), set()).add(grade["solution"])
    return {problem for problem, done in solutions.items() if done >= set(SOLUTIONS)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "kernelbench", type=Path, help="the KernelBench/ folder of a checkout (holds level1, level2, ...)"
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--levels", nargs="+", default=["level1", "level2"])
    parser.add_argument("--sample", type=int, default=0, help="problems per level drawn at random; 0: all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per grade, on top of the grade's own limit")
    parser.add_argument("--jobs", type=int, default=1, help="problems graded at once")
    parser.add_argument(
        "--one-process", action="store_true", help="a problem's two grades in one process (kbsweep.grade)"
    )
    parser.add_argument(
        "--skip",
        nargs="+",
        type=Path,
        default=[],
        help="earlier OUT.json files: their problems graded both ways are left out",
    )
    parser.add_argument("--problems", nargs="+", default=[], help="LEVEL/NAME of each problem to grade (default: all)")
    parser.add_argument(
        "--summarize",
        nargs="+",
        type=Path,
        default=[],
        help="earlier OUT.json files: summarize their grades, grade nothing",
    )
    parser.add_argument(
        "--reverse", action="store_true", help="the order from its end: a second run meets the first halfway"
    )
    args = parser.parse_args()
    if args.summarize:
        grades = [g for path in args.summarize for g in json.loads(path.read_text())["grades"]]
        merged = {"sources": [str(p) for p in args.summarize], "summary": summary(grades)}
        args.out.write_text(json.dumps(merged, indent=1))
        print(json.dumps(merged["summary"], indent=1))
        return
    outputs = args.out.with_suffix(".outputs").resolve()
    record: Dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "sample": args.sample,
        "seed": args.seed,
        "jobs": args.jobs,
        "one_process": args.one_process,
        "reverse": args.reverse,
        "skipped": [str(p) for p in args.skip],
        "levels": {},
        "grades": [],
    }
    queues, graded = [], already_graded(args.skip)
    for level in args.levels:
        folder = (args.kernelbench / level).resolve()
        names = kernelbench_names(folder)
        picked = random.Random(args.seed).sample(
            names, args.sample or len(names)
        )  # a random order: any prefix is a random sample
        picked = [
            name
            for name in picked
            if (level, name) not in graded and (not args.problems or f"{level}/{name}" in args.problems)
        ]
        started = time.perf_counter()
        generated = materialize_all(folder, picked)  # one sizing child for the level
        record["levels"][level] = {
            "problems": len(names),
            "order": picked,
            "materialize_s": time.perf_counter() - started,
        }
        queues.append([(level, folder, name, root) for name, root in zip(picked, generated)])
    plan = [item for turn in itertools.zip_longest(*queues) for item in turn if item]  # the levels take turns
    plan = plan[::-1] if args.reverse else plan
    lock = threading.Lock()

    def problem(level: str, folder: Path, name: str, root: Path) -> None:
        fitted = json.loads((root / "fit.json").read_text())
        paths = [root / "solutions" / f"{solution}.py" for solution in SOLUTIONS]
        graded_all = (
            grade_problem(folder, name, paths, outputs, args.timeout_s)
            if args.one_process
            else (grade_one(folder, name, path, outputs, args.timeout_s) for path in paths)
        )
        for solution, graded in zip(SOLUTIONS, graded_all):
            with lock:
                record["grades"].append(
                    {"level": level, "problem": name, "solution": solution, "sizes": fitted.get("sizes"), **graded}
                )
                print(
                    f"{level}/{name} {solution}: {graded['outcome']} {graded.get('verdicts')} {graded['wall_s'] or 0:.1f} s",
                    flush=True,
                )
                record["summary"] = summary(record["grades"])
                args.out.write_text(json.dumps(record, indent=1))

    with ThreadPoolExecutor(args.jobs) as pool:
        for done in [pool.submit(problem, *item) for item in plan]:
            done.result()
    print(json.dumps(record["summary"], indent=1))


if __name__ == "__main__":
    main()
