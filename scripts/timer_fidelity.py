"""Runs on the lent H200: the scored figure beside outside references of the same call ([timer], docs/benchmarks.md).

    python3 scripts/timer_fidelity.py OUT_DIR [--cases bf16,scale_shift,fp8,w4a16,paged] [--budget-s 540]

Per problem, three full grades of its example solution: baselines (eager, compile) timed first into a fresh cache,
then served from that cache, then none. Then, per shape, the same call in this process with the same weights,
inputs and read flush between calls: CUDA-graph-amortized time (a graph of flush+call pairs less a graph of the
flushes alone), and triton's do_bench with its zeroing flush swapped for the read, each beside NVML clock
samples. Rewrites OUT_DIR/timer_fidelity.json after every step.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from gpu_common import H200, REPO, ROOFLINE, SANDBOX, SANDBOX_NOTE

from kbsweep.audit.cases import private_deck
from kbsweep.grader import grade, software_versions
from kbsweep.grader.baselines import BaselineCache
from kbsweep.grader.referee import load_module
from kbsweep.grader.timing import ClockSampler, L2Flush

CASES = {  # name: (problem, example solution, shapes kept)
    "bf16": ("proof/bf16_gemm", "torch_mm", 2),
    "scale_shift": ("demo/scale_shift", "triton", 2),
    "fp8": ("hard/fp8_gemm", "triton", 3),
    "w4a16": ("hard/w4a16_gemm", "triton", 3),
    "paged": ("hard/paged_attention", "triton", 3),
}
CONDITIONS = (("baselines_timed_first", ["eager", "compile"]), ("baselines_cached", ["eager", "compile"]), ("no_baselines", []))
GRAPH_TARGET_MS = 20.0  # one replay of the flush+call graph


def graph_flush_ms(fn, flush) -> dict:
    """Per-call time of ``fn`` replayed in a CUDA graph as flush, call, flush, call ...; the flushes' own graph is
    timed alternately and subtracted. None when the call cannot be captured (a host sync inside it)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(run) -> float:
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    estimate = statistics.median(timed(fn) for _ in range(5))
    pairs = int(max(4, min(200, GRAPH_TARGET_MS / max(estimate, 1e-3))))
    graphs = []
    try:
        for body in ((lambda: [flush(), fn()]), flush):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(pairs):
                    body()
            graphs.append(graph)
    except Exception as exc:  # noqa: BLE001 - recorded: a call a graph cannot hold has no graph figure
        torch.cuda.synchronize()
        return {"ms": None, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    both, flushes = [], []
    with ClockSampler(torch.device("cuda")) as clocks:
        for rep in range(12):
            b, f = timed(graphs[0].replay), timed(graphs[1].replay)
            if rep >= 2:  # the first replays warm the graphs up
                both.append(b)
                flushes.append(f)
    return {"ms": (statistics.median(both) - statistics.median(flushes)) / pairs, "pairs": pairs,
            "flush_ms": statistics.median(flushes) / pairs, "clocks": clocks.summary()}


def do_bench_read_flush(fn, flush) -> dict:
    import triton.testing
    from triton import runtime

    driver = runtime.driver.active
    zeroing = driver.clear_cache
    driver.clear_cache = lambda cache: flush()
    try:
        with ClockSampler(torch.device("cuda")) as clocks:
            ms = triton.testing.do_bench(fn, return_mode="median")
    finally:
        driver.clear_cache = zeroing
    return {"ms": ms, "clocks": clocks.summary()}


def outside(problem, solution: Path, shape: dict) -> dict:
    """The example solution built as the grader builds it (reference weights, seeded inputs), timed here."""
    ref = load_module("fidelity_reference", problem.grader_reference)
    sol = load_module("fidelity_solution", solution)
    torch.manual_seed(42)
    ref_model = ref.Model(*ref.get_init_inputs(dict(shape))).cuda().eval()
    model = sol.ModelNew(*ref.get_init_inputs(dict(shape))).cuda().eval()
    model.load_state_dict(ref_model.state_dict())
    torch.manual_seed(2026 + 7919)
    inputs = list(ref.get_inputs(dict(shape), torch.device("cuda")))
    flush = L2Flush(int(float(ROOFLINE.get("l2_mib") or 50) * 2**20))
    with torch.no_grad():
        call = lambda: model(*inputs)  # noqa: E731
        first = graph_flush_ms(call, flush)
        bench = do_bench_read_flush(call, flush)
        loaded = graph_flush_ms(call, flush)  # right after do_bench's 100+ ms of load
    return {"graph_flush": first, "do_bench_read_flush": bench, "graph_flush_after_load": loaded}


def shape_rows(name: str, grades: dict, local: list) -> list:
    rows = []
    for index, here in enumerate(local):
        timed = {cond: (g["timings"][index]["candidate"] if g.get("outcome") == "pass" else {}) for cond, g in grades.items()}
        ms = {cond: t.get("median_ms") for cond, t in timed.items()}
        valid = [m for m in ms.values() if m]
        scored = ms.get("no_baselines") or (valid[0] if valid else None)
        graph = here["graph_flush"].get("ms")
        rows.append({
            "case": name, "shape": here["shape"], "scored_ms": ms,
            "regrade_spread": (max(valid) - min(valid)) / statistics.mean(valid) if len(valid) > 1 else None,
            "graph_flush_ms": graph, "graph_flush_after_load_ms": here["graph_flush_after_load"].get("ms"),
            "do_bench_read_flush_ms": here["do_bench_read_flush"]["ms"],
            "scored_over_graph": scored / graph if scored and graph else None,
            "scored_over_do_bench": scored / here["do_bench_read_flush"]["ms"] if scored else None,
            "scored_clocks": {cond: t.get("clocks") for cond, t in timed.items()}, "outside": here,
            "mode": next((t.get("mode") for t in timed.values() if t), None),
        })
    return rows


def markdown(rows: list) -> str:
    """The benchmarks table: scored ms per condition, the outside references, and the ratios the issue bounds."""
    pct = lambda v: f"{(v - 1) * 100:+.1f}%" if v else "-"  # noqa: E731
    lines = ["| case | shape | scored ms (timed first / cached / none) | spread | graph+flush ms | vs graph | do_bench read-flush ms | vs do_bench | SM MHz scored / graph |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        scored = " / ".join(f"{m:.4f}" if m else "-" for m in r["scored_ms"].values())
        clocks = (r["scored_clocks"].get("no_baselines") or {}).get("sm_mhz", {}).get("median"), (r["outside"]["graph_flush"].get("clocks") or {}).get("sm_mhz", {}).get("median")
        graph = f"{r['graph_flush_ms']:.4f}" if r["graph_flush_ms"] else "-"
        lines.append(f"| {r['case']} | {','.join(f'{k}={v}' for k, v in r['shape'].items())} | {scored} | {(r['regrade_spread'] or 0) * 100:.1f}% | {graph} | "
                     f"{pct(r['scored_over_graph'])} | {r['do_bench_read_flush_ms']:.4f} | {pct(r['scored_over_do_bench'])} | {clocks[0]} / {clocks[1]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--budget-s", type=float, default=540)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.time()
    report = {"host": {**software_versions(), "gpu": torch.cuda.get_device_name(), "sandbox": SANDBOX_NOTE}, "rows": [], "grades": {}}

    def save() -> None:
        (args.out / "timer_fidelity.json").write_text(json.dumps(report, indent=1, default=str))

    for name in args.cases.split(","):
        pid, solution_name, keep = CASES[name]
        if time.time() - began > args.budget_s - 60:
            print(f"skipped {name}: budget", flush=True)
            continue
        with tempfile.TemporaryDirectory() as folder:
            problem = private_deck(REPO / "problems", pid, Path(folder), keep)
            solution = REPO / "problems" / pid / "solutions" / f"{solution_name}.py"
            cache = BaselineCache(Path(folder) / "baselines.json")
            grades = {}
            for cond, baselines in CONDITIONS:
                result = grade(problem, solution, H200, ROOFLINE, baselines=baselines, baseline_cache=cache, compile_mode="default",
                               timeout_s=min(300, args.budget_s - (time.time() - began)), log_dir=Path(folder) / cond, sandbox=SANDBOX)
                grades[cond] = result
                report["grades"][f"{name}/{cond}"] = {k: result.get(k) for k in ("outcome", "message", "score", "speedup", "grade_s")}
                print(f"[{time.time() - began:4.0f} s] {name} {cond}: {result['outcome']} score={result.get('score')} "
                      f"{[t['candidate'].get('median_ms') for t in result.get('timings') or []]} {result.get('message') or ''}", flush=True)
                save()
            local = [{"shape": shape, **outside(problem, solution, shape)} for shape in problem.shapes("shapes")]
            report["rows"] += shape_rows(name, grades, local)
            for row in report["rows"][-len(local):]:
                print(json.dumps({k: row[k] for k in ("case", "shape", "scored_ms", "graph_flush_ms", "graph_flush_after_load_ms",
                                                      "do_bench_read_flush_ms", "regrade_spread")}, default=str), flush=True)
            save()
    (args.out / "timer_fidelity.md").write_text(markdown(report["rows"]))
    print(markdown(report["rows"]), flush=True)
    print(f"done in {time.time() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
