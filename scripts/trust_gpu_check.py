"""Runs on the lent GPU: the split grader (referee + candidate runner) on real kernels, and the exploit and legit
suites graded there (docs/grading.md's threat model; results for docs/benchmarks.md).

    python3 scripts/trust_gpu_check.py OUT_DIR [--only smoke|suites] [--budget-s 500] [--cases a,b,...]

smoke: a copy-bound and a GEMM-bound solution, the fp8 deck example and a latency-regime megakernel, each graded in
bench mode: outcome, scored time, the referee's corroboration of it, profiled launches. suites: every file of
tests/exploits and tests/legit graded on its problem's first real shape and audited: an exploit must not end
`pass` + `clean`, a legit solution must; a multi-rank case runs at as many ranks as GPUs are visible, at most its
own (its row says how many). Rewrites OUT_DIR/trust_gpu.json and trust_gpu.md after every case.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from gpu_common import GPU, REPO, ROOFLINE, SANDBOX, SANDBOX_NOTE

from kbsweep.audit.cases import run_case
from kbsweep.grader import grade, software_versions
from kbsweep.grader.request import GradeRequest

TIMING = {"min_runs": 3, "max_runs": 40, "max_time_s": 1.0}
SMOKE = [  # (problem, solution, shapes kept)
    ("demo/scale_shift", "triton", 2),
    ("proof/bf16_gemm", "torch_mm", 2),
    ("hard/fp8_gemm", "triton", 1),
    ("mega/dense_decode", "triton", 1),
]
MIN_CASE_S = 30
CPU_ONLY = (
    "topk_cpp_extension",
)  # its C++ reads the tensor through a host accessor: a CPU solution, it faults on a GPU


def smoke_row(pid: str, result: dict) -> dict:
    shapes = []
    for entry in result.get("timings") or []:
        timed = entry.get("candidate") or {}
        shapes.append(
            {
                "shape": entry["shape"],
                "median_ms": timed.get("median_ms"),
                "mode": timed.get("mode"),
                "corroboration": timed.get("corroboration"),
                "launches": (entry.get("profile") or {}).get("launches_per_call"),
                "median_launches": (entry.get("profile") or {}).get("median_launches"),
                "kernels": (entry.get("profile") or {}).get("kernels"),
            }
        )
    return {
        "case": pid,
        "outcome": result["outcome"],
        "message": (result.get("message") or "")[:300],
        "score": result.get("score"),
        "findings": sorted({f["kind"] for f in result.get("findings") or []}),
        "shapes": shapes,
        "grade_s": result.get("grade_s"),
    }


def suite_row(path: Path, result: dict, audited: dict) -> dict:
    legit = path.parent.name == "legit"
    clean = result["outcome"] == "pass" and audited["verdict"] == "clean"
    return {
        "case": f"{path.parent.name}/{path.stem}",
        "ok": clean if legit else not clean,
        "outcome": result["outcome"],
        "verdict": audited["verdict"],
        "message": (result.get("message") or "")[:200],
        "findings": sorted({f"{f['layer']}/{f['kind']}" for f in audited["findings"] if f["verdict"]}),
    }


def markdown(rows: list) -> str:
    lines = ["| case | ok | outcome | verdict | findings / corroboration |", "|---|---|---|---|---|"]
    for row in rows:
        if "shapes" in row:
            detail = "; ".join(
                f"{s['median_ms']:.4f} ms wall/claimed {s['corroboration']['wall_over_claimed']:.3f} launches {s['launches']}"
                for s in row["shapes"]
                if s.get("corroboration")
            )
        else:
            detail = ", ".join(row["findings"]) or "-"
        lines.append(
            f"| {row['case']} | {row.get('ok', '-')} | {row['outcome']} | {row.get('verdict', '-')} | {detail} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", choices=("smoke", "suites"))
    parser.add_argument("--budget-s", type=float, default=500)
    parser.add_argument("--cases", help="comma-separated case stems of the suites, in this order (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    began, rows = time.time(), []
    host = {**software_versions(), "gpu": torch.cuda.get_device_name(), "sandbox": SANDBOX_NOTE}
    print(host, flush=True)

    def record(row: dict) -> None:
        rows.append(row)
        print(f"[{time.time() - began:4.0f} s] {json.dumps(row, default=str)[:600]}", flush=True)
        (args.out / "trust_gpu.json").write_text(json.dumps({"host": host, "rows": rows}, indent=1, default=str))
        (args.out / "trust_gpu.md").write_text(markdown(rows))

    def left() -> float:
        return args.budget_s - (time.time() - began)

    if args.only in (None, "smoke"):
        for pid, solution, keep in SMOKE:
            if left() < MIN_CASE_S:
                break
            track, name = pid.split("/")
            with tempfile.TemporaryDirectory() as folder:
                from kbsweep.audit.cases import private_deck

                prob = private_deck(REPO / "problems", pid, Path(folder), keep)
                result = grade(
                    GradeRequest(
                        prob,
                        REPO / "problems" / track / name / "solutions" / f"{solution}.py",
                        GPU,
                        ROOFLINE,
                        mode="bench",
                        timing=TIMING,
                        timeout_s=left(),
                        log_dir=Path(folder) / "grade",
                        sandbox=SANDBOX,
                    )
                ).to_json()
            record(smoke_row(pid, result))
    if args.only in (None, "suites"):
        cases = sorted((REPO / "tests/legit").glob("*.py")) + sorted(
            p for p in (REPO / "tests/exploits").glob("*.py") if not p.name.startswith("_")
        )
        if args.cases:
            by_stem = {p.stem: p for p in cases}
            cases = [by_stem[stem] for stem in args.cases.split(",")]
        with (
            tempfile.TemporaryDirectory() as shared
        ):  # cases of a problem fork from the same warm zygotes, as a sweep's cells do
            for path in (p for p in cases if p.stem not in CPU_ONLY):
                if left() < MIN_CASE_S:
                    print(f"skipped {path.name}: budget", flush=True)
                    continue
                with tempfile.TemporaryDirectory() as folder:
                    _, result, audited = run_case(
                        path,
                        Path(folder),
                        GPU,
                        ROOFLINE,
                        REPO / "problems",
                        timing=TIMING,
                        max_shapes=1,
                        timeout_s=min(left(), 120),
                        sandbox=SANDBOX,
                        max_world=torch.cuda.device_count(),
                        shared=Path(shared),
                    )
                record(
                    {
                        **suite_row(path, result, audited),
                        "world": result.get("world_size"),
                        "at_s": round(time.time() - began, 1),
                    }
                )
    print(markdown(rows), flush=True)


if __name__ == "__main__":
    main()
