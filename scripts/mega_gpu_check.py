"""Runs on a GPU machine: the mega track's launch gate end to end (docs/benchmarks.md), one call, tables at the end.

    python3 scripts/mega_gpu_check.py OUT_DIR [--only dense|kimi] [--budget-s 420]

First, without the grader: a CUDA graph of 7 small kernels is profiled the way the worker profiles a candidate,
to show that a replay counts as the kernels inside it. Then dense_decode's single-launch Triton megakernel
(gate must pass), its CUDA-graph solution (correct, gate must fail) and the reference as the candidate (first
two shapes, one seed: many launches), each graded in full on the GPU with baseline.py and eager timed beside.
Should the megakernel not pass, the same source with one program per launch (no waiting across SMs) is graded
next. ``--only kimi`` grades kimi_linear_decode's multi-kernel Triton solution instead (correct, gate must
fail). Grades run one after another, each capped at 240 s; one that would start past the budget is skipped.
One JSON per grade in OUT_DIR.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
from gpu_common import GPU, REPO, ROOFLINE, SANDBOX, SANDBOX_NOTE

from kbsweep.config.problems import load_problem
from kbsweep.grader import grade
from kbsweep.grader.request import GradeRequest

TIMING = {"min_runs": 5, "max_runs": 50, "rel_err": 0.005, "max_time_s": 1.5}
PLANS = {
    "dense": [("dense_decode", "triton", True), ("dense_decode", "graph", False), ("dense_decode", "reference", False)],
    "kimi": [("kimi_linear_decode", "triton", False)],
}


def graph_profile_check() -> dict:
    """Kernels per replay of a captured graph of 7 kernels, counted like the worker's profile()."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(1 << 16, device="cuda")

    def seven():
        y = x
        for _ in range(7):
            y = y * 1.0001  # one elementwise kernel each
        return y

    seven()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seven()
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
    kernels = [
        e.name
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("Memcpy")
    ]
    return {"kernels_per_replay": len(kernels) / 3, "names": sorted(set(kernels)), "ok": len(kernels) == 21}


ONE_PROGRAM = ("sms = torch.cuda.get_device_properties(dev).multi_processor_count if on_gpu else 2", "sms = 1")


def candidate(problem, label: str, out: Path) -> Path:
    """A bundled solution; or the reference as the candidate (ModelNew = Model); or the megakernel at one program."""
    if label not in ("reference", "triton_1program"):
        return problem.root / "solutions" / f"{label}.py"
    if label == "reference":
        source = problem.reference.read_text() + "\n\nModelNew = Model\n"
    else:
        source = (problem.root / "solutions/triton.py").read_text()
        assert ONE_PROGRAM[0] in source
        source = source.replace(*ONE_PROGRAM)
    path = out / "candidates" / f"{problem.name}-{label}" / "solution.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


def rows_of(name: str, label: str, expect_pass: bool, result: dict) -> list:
    """One markdown row per shape: launches, kernels, gate, ms, speedups, roofline fraction."""
    if result["outcome"] != "pass":
        return [
            f"| {name} | {label} | - | - | - | {result['outcome']}: {(result.get('message') or '')[:120]} | - | - | - | - | - | - |"
        ]
    gates = {json.dumps(g["shape"], sort_keys=True): g for g in result["evidence"].get("launch_gate", [])}
    rows = []
    for entry, scored in zip(result["timings"], result["shapes"]):
        gate = gates.get(json.dumps(entry["shape"], sort_keys=True), {})
        passed = gate.get("passed")
        verdict = ("pass" if passed else "FAIL") + ("" if passed == expect_pass else " (UNEXPECTED)")
        kernels = gate.get("kernels") or {}
        names = ", ".join(f"{k[:40]}×{v:g}" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:4])
        base_ms = (entry["baselines"].get("baseline") or {}).get("median_ms")
        graph_ms = entry["candidate"].get("graph_ms")
        rows.append(
            f"| {name} | {label} | {entry['shape']['ctx']} | {gate.get('launches', '-')} | {verdict} | {names}{' …' if len(kernels) > 4 else ''} "
            f"| {scored['ms']:.4f} | {graph_ms if graph_ms is None else f'{graph_ms:.4f}'} | {'-' if base_ms is None else f'{base_ms:.4f}'} "
            f"| {scored['speedup'].get('baseline', 0):.2f} | {scored['speedup'].get('eager', 0):.2f} | {scored['memory_fraction']:.3f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", choices=sorted(PLANS), default="dense")
    parser.add_argument("--budget-s", type=float, default=420.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.time()
    env = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "sandbox": SANDBOX_NOTE}
    import triton

    env["triton"] = triton.__version__
    print(env, flush=True)
    graph_check = graph_profile_check()
    print("graph replay profile:", graph_check, flush=True)
    summary = {"env": env, "graph_profile_check": graph_check, "grades": {}}
    rows, skipped = [], []
    plan = list(PLANS[args.only])
    while plan:
        name, label, expect_pass = plan.pop(0)
        left = args.budget_s - (time.time() - began)
        if left < 60:
            skipped.append(f"{name}/{label}")
            continue
        problem = load_problem(REPO / "problems/mega" / name, "mega")
        if label == "reference":  # many launches whatever the shape: two shapes, one seed keep it short
            problem = dataclasses.replace(
                problem, spec=dataclasses.replace(problem.spec, shapes=problem.spec.shapes[:2], seeds=1)
            )
        result = grade(
            GradeRequest(
                problem,
                candidate(problem, label, args.out),
                GPU,
                ROOFLINE,
                baselines=["baseline", "eager"],
                sandbox=SANDBOX,
                timeout_s=min(left, 240),
                timing=TIMING,
                log_dir=args.out / "logs" / f"{name}-{label}",
            )
        ).to_json()
        (args.out / f"{name}-{label}.json").write_text(json.dumps(result, indent=1, default=str))
        summary["grades"][f"{name}/{label}"] = {
            k: result.get(k) for k in ("outcome", "message", "score", "speedup", "grade_s")
        }
        rows += rows_of(name, label, expect_pass, result)
        gate = result.get("evidence", {}).get("launch_gate") or [{}]
        if (
            label == "triton"
            and name == "dense_decode"
            and not (result["outcome"] == "pass" and all(g.get("passed") for g in gate))
        ):
            plan.insert(0, (name, "triton_1program", True))
        print(
            f"[{time.time() - began:5.0f} s] {name}/{label}: {result['outcome']} score={result.get('score')} "
            f"findings={sorted({f['kind'] for f in result.get('findings', [])})} ({result['grade_s']:.0f} s)",
            flush=True,
        )
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(
        "\n| problem | solution | ctx | launches/call | gate | kernels (per call) | ms | graph-replay ms | baseline ms "
        "| speedup vs baseline | vs eager | DRAM fraction |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(
        f"\ngraph replay of 7 kernels counted as {graph_check['kernels_per_replay']:g} per replay ({'ok' if graph_check['ok'] else 'UNEXPECTED'}); "
        f"total {time.time() - began:.0f} s" + (f"; skipped (budget): {', '.join(skipped)}" if skipped else "")
    )


if __name__ == "__main__":
    main()
