"""Where a grade's time goes: `kbsweep grade` of bundled solutions, cold (an empty outputs folder: every baseline timed)
then warm (the same folder: baselines from its cache), each in a fresh process, split by stage.

    python scripts/grade_cost.py OUT.json [--gpu GPU] [--repeats N] [--problems demo/scale_shift,hard/topk]
                                          [--repo PATH ...] [KEY=VALUE ...]

GPU defaults to ``auto`` (``cpu`` where there is none: a dry run of the same path). Each ``--repo`` is a checkout graded
with its own code, side by side in every repeat (default: this one); KEY=VALUE are overrides for every grade. Stages
per grade, in seconds: ``cli`` (the process's start, config, problem checks, zygotes: its wall less the grade's
``grade_s``), ``startup`` (staging, both grading processes up: ``startup_s``), then the referee's own clocks
(``evidence.stages``): ``load_reference``, ``baselines``, ``import``, ``correctness``, ``timing``, ``audit``, and
``rest`` (the result's way back and scoring: ``grade_s`` less the above). Each baseline's source (``timed``, ``cache``,
``seed``) and, where timed, its ``cost_s`` (check, timing) are listed. Writes every grade and the medians to OUT.json and
prints a table.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent.parent
STAGES = ("cli", "startup", "load_reference", "baselines", "import", "correctness", "timing", "audit", "rest", "wall")
REFEREE = {
    "load_reference": "load_reference",
    "baselines": "baselines",
    "import_candidate": "import",
    "kernelbench_correctness": "correctness",
    "correctness": "correctness",
    "timing": "timing",
    "kernelbench_timing": "timing",
    "audit": "audit",
}
RUN = "import sys; from kbsweep.cli import main; sys.exit(main())"


def grade_once(repo: Path, problem: str, gpu: str, outputs: Path, overrides: List[str]) -> Dict[str, Any]:
    """One `kbsweep grade` of ``problem``'s bundled Triton solution in a fresh process, with ``outputs`` as its folder."""
    solution = repo / "problems" / problem / "solutions" / "triton.py"
    env = {**os.environ, "KBSWEEP_OUTPUTS": str(outputs), "PYTHONPATH": str(repo)}
    began = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", RUN, "grade", f"problem={problem}", f"solution={solution}", f"gpu={gpu}", *overrides],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - began
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        return {"wall_s": wall, "exit": proc.returncode, "error": (proc.stderr or proc.stdout)[-2000:]}
    return {"wall_s": wall, "exit": proc.returncode, **breakdown(result, wall)}


def breakdown(result: Dict[str, Any], wall: float) -> Dict[str, Any]:
    """The stages of one grade's result (seconds), and where each baseline came from."""
    grade_s, startup = float(result.get("grade_s") or 0.0), float(result.get("startup_s") or 0.0)
    stages = {name: 0.0 for name in STAGES}
    for name, clock in ((result.get("evidence") or {}).get("stages") or {}).items():
        stages[REFEREE.get(name, "rest")] += float(clock.get("s") or 0.0)
    stages.update(cli=wall - grade_s, startup=startup, wall=wall)
    stages["rest"] += grade_s - startup - sum(stages[k] for k in STAGES if k not in ("cli", "startup", "rest", "wall"))
    sources: List[Dict[str, Any]] = []
    for entry in result.get("timings") or []:
        for name, timed in (entry.get("baselines") or {}).items():
            if isinstance(timed, dict):
                record = timed.get("record") or {}
                sources.append(
                    {
                        "shape": entry.get("shape"),
                        "baseline": name,
                        "source": record.get("source"),
                        "median_ms": timed.get("median_ms"),
                        "runs": timed.get("runs"),
                        "cost_s": timed.get("cost_s") if record.get("source") == "timed" else None,
                    }
                )
    return {
        "outcome": result.get("outcome"),
        "score": result.get("score"),
        "grade_s": grade_s,
        "stages": {k: round(v, 3) for k, v in stages.items()},
        "baselines": sources,
        "env": {k: (result.get("env") or {}).get(k) for k in ("torch", "triton", "cuda")},
        "card": sorted({g.get("name") for g in (result.get("env") or {}).get("graded_on") or []}) or ["cpu"],
    }


def checkout(repo: Path) -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True, text=True
        ).stdout.strip()
        return head + ("+tree" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "no git"


def medians(grades: List[Dict[str, Any]]) -> Dict[str, Dict[str, float]]:
    """Per (checkout, problem, cold or warm): each stage's median over the repeats."""
    groups: Dict[str, List[Dict[str, float]]] = {}
    for g in grades:
        if "stages" in g:
            groups.setdefault(f"{g['repo']} {g['problem']} {g['state']}", []).append(g["stages"])
    return {
        label: {k: round(statistics.median(s[k] for s in rows), 3) for k in STAGES} for label, rows in groups.items()
    }


def table(summary: Dict[str, Dict[str, float]]) -> str:
    width = max([len(label) for label in summary] + [10])
    lines = [f"{'':<{width}} " + " ".join(f"{k[:11]:>11}" for k in STAGES)]
    lines += [f"{label:<{width}} " + " ".join(f"{row[k]:>11.2f}" for k in STAGES) for label, row in summary.items()]
    return "\n".join(lines)


def options(argv: List[str]) -> Dict[str, Any]:
    opts: Dict[str, Any] = {
        "gpu": "auto",
        "repeats": 1,
        "problems": ["demo/scale_shift", "hard/topk"],
        "repos": [],
        "overrides": [],
        "out": None,
    }
    args = iter(argv)
    for arg in args:
        if arg == "--gpu":
            opts["gpu"] = next(args)
        elif arg == "--repeats":
            opts["repeats"] = int(next(args))
        elif arg == "--problems":
            opts["problems"] = next(args).split(",")
        elif arg == "--repo":
            opts["repos"].append(Path(next(args)).resolve())
        elif "=" in arg:
            opts["overrides"].append(arg)
        elif opts["out"] is None:
            opts["out"] = Path(arg)
        else:
            raise SystemExit(f"grade_cost.py: unexpected argument {arg!r}\n{__doc__}")
    if opts["out"] is None:
        raise SystemExit(__doc__)
    opts["repos"] = opts["repos"] or [HERE]
    return opts


def main(argv: List[str]) -> None:
    opts = options(argv)
    grades: List[Dict[str, Any]] = []
    for repeat in range(opts["repeats"]):
        for problem in opts["problems"]:
            for repo in opts["repos"]:  # side by side within a repeat: the host's drift falls on every checkout alike
                with tempfile.TemporaryDirectory(prefix="grade-cost-") as outputs:
                    for state in ("cold", "warm"):
                        graded = grade_once(repo, problem, opts["gpu"], Path(outputs), opts["overrides"])
                        grades.append(
                            {"repo": str(repo), "problem": problem, "state": state, "repeat": repeat, **graded}
                        )
                        stages = graded.get("stages") or {}
                        print(
                            f"{repo.name} {problem} {state}: {graded.get('outcome') or graded.get('error', '')[-200:]}, "
                            + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()),
                            flush=True,
                        )
    summary = medians(grades)
    record = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "gpu": opts["gpu"],
        "overrides": opts["overrides"],
        "checkouts": {str(r): checkout(r) for r in opts["repos"]},
        "grades": grades,
        "medians_s": summary,
    }
    opts["out"].parent.mkdir(parents=True, exist_ok=True)
    opts["out"].write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(table(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
