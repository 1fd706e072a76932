"""Runs on the lent GPU: every bundled solution and every case of tests/legit graded as a user's `kbsweep grade`
grades a file (full mode, default settings, the baseline cache of one outputs folder: the first grade of a problem
times its baselines, the rest read them), each REPEATS times, and audited as a cell's final solution is.

    python3 scripts/honest_gpu_suite.py OUT_DIR [BUDGET_S] [--repeats N] [--only SUBSTR,...] [--set KEY=VALUE ...]

Honest work must pass clean with a score, every time, its scores within 2 % of each other. After every grade it
rewrites OUT_DIR/honest_gpu.json: per grade the outcome, score, findings, verdict, seconds, and per shape the
referee's figure, the runner's own, and every timed batch's pair of them (the corroboration's raw data,
docs/grading.md). No grade starts after BUDGET_S (default 540). Multi-rank solutions need as many GPUs as their
problem's ranks and are listed as not run where the machine has fewer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpu_common import REPO, SANDBOX_NOTE

from kbsweep.api import grade
from kbsweep.audit import audit, workspace_helpers
from kbsweep.audit.cases import header, staged_files
from kbsweep.config.problems import load_problem

MIN_GRADE_S = 25
# bundled solutions a track flags by design: the mega track's CUDA graph of eager ops is its example of no megakernel
FLAGGED = {"problems/mega/dense_decode/solutions/graph.py"}


def cases(only: list) -> list:
    """(file, problem) of every bundled solution but the deliberately wrong or flagged ones and every legit case, the
    bundled ones first; with ``only``, those whose path holds one of its strings, in its order."""
    bundled = [
        (p, f"{p.parts[-4]}/{p.parts[-3]}")
        for p in sorted(REPO.glob("problems/*/*/solutions/*.py"))
        if not p.stem.startswith("wrong") and str(p.relative_to(REPO)) not in FLAGGED
    ]
    legit = [(p, header(p).get("problem", "")) for p in sorted((REPO / "tests/legit").glob("*.py"))]
    chosen = [(p, problem) for p, problem in bundled + legit if problem]
    if not only:
        return chosen
    return [c for s in only for c in chosen if s in str(c[0].relative_to(REPO))]


def staged(path: Path, folder: Path) -> Path:
    """``path`` as solution.py with the helpers its header stages, in ``folder``."""
    folder.mkdir(parents=True)
    for helper in staged_files(path):
        shutil.copy2(helper, folder / helper.name)
    shutil.copy2(path, folder / "solution.py")
    return folder / "solution.py"


def shapes(result: dict) -> list:
    rows = []
    for entry in result.get("timings") or []:
        candidate = entry.get("candidate") or {}
        corroboration = candidate.get("corroboration") or {}
        rows.append(
            {
                "shape": entry.get("shape"),
                "held_out": entry.get("held_out", False),
                "timer": candidate.get("timer"),
                "median_ms": candidate.get("median_ms"),
                "runner_median_ms": corroboration.get("runner_median_ms"),
                "wall_over_claimed": corroboration.get("wall_over_claimed"),
                "null_ms": corroboration.get("null_ms"),
                "null_copies_ms": corroboration.get("null_copies_ms"),
                "null_loop_ms": corroboration.get("null_loop_ms"),
                "round_trip_ms": corroboration.get("round_trip_ms"),
                "round_trip_split_ms": corroboration.get("round_trip_split_ms"),
                "round_trip_empty_ms": corroboration.get("round_trip_empty_ms"),
                "batches": corroboration.get("batches"),
                "per_batch": candidate.get("per_batch"),
                "baselines_others_cpus": {
                    name: b.get("host_others_cpus")
                    for name, b in (entry.get("baselines") or {}).items()
                    if isinstance(b, dict)
                },
            }
        )
    return rows


def ratio_table(grades: list) -> dict:
    """The corroboration's distribution over the record: per timer kind, the quantiles of each batch's referee figure
    over the runner's, and of each shape's median of them with the slack taken off and added (what the rule reads),
    with the shapes at the extremes named."""
    per_batch, per_shape = {}, []
    for row in grades:
        for entry in row.get("shapes") or []:
            batches = entry.get("batches") or []
            for kind, referee, runner, *_ in batches:
                per_batch.setdefault(kind, []).append(referee / max(runner, 1e-9))
            if batches:
                over = statistics.median((r - slack) / max(c, 1e-9) for _, r, c, slack, *_ in batches)
                under = statistics.median((r + slack) / max(c, 1e-9) for _, r, c, slack, *_ in batches)
                per_shape.append((over, under, f"{row['case']}#{row['repeat']} {entry['shape']}"))

    def quantiles(values: list) -> dict:
        values = sorted(values)
        pick = lambda q: round(values[min(len(values) - 1, int(q * len(values)))], 3)  # noqa: E731
        return {
            "n": len(values),
            "min": round(values[0], 3),
            "p01": pick(0.01),
            "p50": pick(0.5),
            "p99": pick(0.99),
            "max": round(values[-1], 3),
        }

    table = {f"batch_{kind}": quantiles(values) for kind, values in per_batch.items() if values}
    others = [
        (b[-1], b[-1] / max(b[5], 1e-9))
        for row in grades
        for entry in row.get("shapes") or []
        for b in entry.get("batches") or []
        if isinstance(b[-1], (int, float)) and len(b) >= 8
    ]
    residual = [
        b[5] - entry["null_ms"][b[0]] - b[2] * entry["per_batch"]
        for row in grades
        for entry in row.get("shapes") or []
        for b in entry.get("batches") or []
        if len(b) >= 8 and isinstance(b[5], (int, float)) and b[0] in (entry.get("null_ms") or {})
    ]
    if residual:  # per batch, what its wall held beyond its null and the runner's own figure for its calls (ms)
        table["residual_ms"] = quantiles(residual)
    if others:  # the runner's other threads' CPU per timed batch (runner_cpu), in ms and as a share of the batch's wall
        table["others_cpu_ms"] = quantiles([ms for ms, _ in others])
        table["others_cpu_share"] = quantiles([share for _, share in others])
    if per_shape:
        table["shape_less_slack"] = {**quantiles([o for o, _, _ in per_shape]), "max_at": max(per_shape)[2]}
        table["shape_plus_slack"] = {
            **quantiles([u for _, u, _ in per_shape]),
            "min_at": min(per_shape, key=lambda t: t[1])[2],
        }
    return table


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("budget_s", type=float, nargs="?", default=540.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="")
    parser.add_argument("--set", action="append", default=[], help="a grade override, KEY=VALUE")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gpus = torch.cuda.device_count()
    record = {
        "device": torch.cuda.get_device_name() if gpus else "cpu",
        "gpus": gpus,
        "torch": torch.__version__,
        "sandbox": SANDBOX_NOTE,
        "overrides": args.set,
        "grades": [],
        "not_run": [],
    }
    print(f"{record['device']} x{gpus} torch {torch.__version__}; {SANDBOX_NOTE}", flush=True)
    began = time.time()
    outputs = Path(tempfile.mkdtemp(prefix="honest-suite-"))
    todo = [
        (path, problem, repeat)
        for path, problem in cases([s for s in args.only.split(",") if s])
        for repeat in range(args.repeats)
    ]
    for path, problem, repeat in todo:
        name = str(path.relative_to(REPO))
        world = (
            int(header(path).get("world", 1)) if "multi/" not in problem else max(2, int(header(path).get("world", 2)))
        )
        if world > max(gpus, 1):  # a CPU dry run grades single-rank cases on the CPU
            if repeat == 0:
                record["not_run"].append({"case": name, "why": f"needs {world} GPUs, the machine has {gpus}"})
            continue
        if args.budget_s - (time.time() - began) < MIN_GRADE_S:
            record["not_run"].append({"case": name, "repeat": repeat, "why": "the budget was spent"})
            continue
        started = time.time()
        solution = staged(path, outputs / "cases" / f"{name.replace('/', '_')}-{repeat}")
        try:
            graded = grade(problem, str(solution), "gpu=auto", f"paths.outputs={outputs}", *args.set)
            result = graded.result
            deck = load_problem(REPO / "problems" / problem, problem.split("/")[0])
            audited = audit(
                path.read_text(),
                deck.spec.forbidden,
                result,
                problem=deck,
                helpers=workspace_helpers(solution.parent, deck.reference.read_text()),
            )
        except Exception as exc:  # noqa: BLE001 - one case's failure is a row of the record, not the end of the run
            record["grades"].append(
                {"case": name, "problem": problem, "repeat": repeat, "error": f"{type(exc).__name__}: {exc}"[:400]}
            )
            print(f"[{time.time() - began:4.0f} s] ERROR {name} #{repeat}: {exc}", flush=True)
            continue
        row = {
            "case": name,
            "problem": problem,
            "repeat": repeat,
            "seconds": round(time.time() - started, 1),
            "outcome": result["outcome"],
            "message": (result.get("message") or "")[:300],
            "score": result.get("score"),
            "score_note": result.get("score_note"),
            "grader_findings": [(f.get("kind"), (f.get("detail") or "")[:160]) for f in result.get("findings") or []],
            "verdict": audited["verdict"],
            "audit_findings": [(f["layer"], f["kind"], f["detail"][:160]) for f in audited["findings"] if f["verdict"]],
            "env_gpu": ((result.get("env") or {}).get("gpus") or [{}])[0].get("name"),
            "shapes": shapes(result),
        }
        record["grades"].append(row)
        print(
            f"[{time.time() - began:4.0f} s] {name} #{repeat}: {row['outcome']} score={row['score']} verdict={row['verdict']} "
            f"{row['seconds']} s {[k for k, _ in row['grader_findings']]} {[f[1] for f in row['audit_findings']]}",
            flush=True,
        )
        (args.out / "honest_gpu.json").write_text(json.dumps(record, indent=1, default=str))
    scores = {}
    for row in record["grades"]:
        scores.setdefault(row["case"], []).append(row.get("score"))
    for case, values in scores.items():
        known = [v for v in values if isinstance(v, (int, float))]
        spread = (
            (max(known) - min(known)) / statistics.median(known)
            if len(known) > 1 and statistics.median(known)
            else None
        )
        print(f"{case}: scores {values} spread {spread if spread is None else f'{100 * spread:.1f} %'}", flush=True)
    record["ratios"] = ratio_table(record["grades"])
    print(json.dumps(record["ratios"], indent=1), flush=True)
    (args.out / "honest_gpu.json").write_text(json.dumps(record, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
