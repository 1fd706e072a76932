"""Runs on the lent GPU: the scored figure beside outside references of the same call (docs/benchmarks.md, "Timer fidelity").

    python3 scripts/timer_fidelity.py OUT_DIR [--cases bf16,scale_shift,fp8,w4a16,paged] [--budget-s 540]
                                              [--conditions no_baselines,...] [--probe]

Per problem, three full grades of its example solution: baselines (eager, compile) timed first into a fresh cache,
then served from that cache, then none. Then, per shape, the same call in this process with the same weights,
inputs and read flush between calls: CUDA-graph-amortized time (a graph of flush+call pairs less a graph of the
flushes alone), and triton's do_bench with its zeroing flush swapped for the read, each beside NVML clock
samples, each in three interleaved rounds (their median is the reference), each opened by the grader's warm
calls (``timing.WARM_US`` of flush+call) so the power controller holds the clock a scored batch sees; the graph
also under the runner's profiler session (the grader keeps CUPTI on over every scored call), and cycling through
``DRAWS`` input sets drawn with seeds of their own (the grader times every batch on a fresh draw). ``--probe``
adds the figures that tell a gap's cause apart: the graph over the grader's rotation of input sets, the graph
behind stronger flushes (a buffer of 8x the L2, the 2x buffer read twice), and the grader's own back-to-back
batches run in this process on one set and on the rotation. Rewrites OUT_DIR/timer_fidelity.json
after every step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from gpu_common import GPU, REPO, ROOFLINE, SANDBOX, SANDBOX_NOTE

from kbsweep.audit.cases import private_deck
from kbsweep.grader import grade, software_versions
from kbsweep.grader.baselines import BaselineCache
from kbsweep.grader.request import GradeRequest
from kbsweep.grader.shared import profiling, timing
from kbsweep.grader.shared.modules import load_module
from kbsweep.grader.shared.timing import ClockSampler, L2Flush

CASES = {  # name: (problem, example solution, shapes kept)
    "bf16": ("proof/bf16_gemm", "torch_mm", 2),
    "scale_shift": ("demo/scale_shift", "triton", 2),
    "fp8": ("hard/fp8_gemm", "triton", 3),
    "w4a16": ("hard/w4a16_gemm", "triton", 3),
    "paged": ("hard/paged_attention", "triton", 3),
}
CONDITIONS = (
    ("baselines_timed_first", ["eager", "compile"]),
    ("baselines_cached", ["eager", "compile"]),
    ("no_baselines", []),
)
GRAPH_TARGET_MS = 20.0  # one replay of the flush+call graph
ROUNDS = 3  # of each outside reference, interleaved
IDLE_S = 1.0
DRAWS = 8  # input sets drawn with seeds of their own, which one graph cycles through (the grader draws per batch)


def warm(fn, flush) -> None:
    """A scored batch's history before a reference: the GPU idle for ``IDLE_S`` (a batch follows the referee's
    host work), then the grader's warm calls, flush+call for ``timing.WARM_US`` of GPU work, untimed. Without the
    idle, under the power cap a reference read the heat of the one before it (do_bench, always last in a round,
    read 1.61 ms for the 8192³ GEMM where the graph before it read 1.53)."""
    time.sleep(IDLE_S)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    flush()
    fn()
    end.record()
    torch.cuda.synchronize()
    for _ in range(min(500, int(timing.WARM_US / 1e3 / max(start.elapsed_time(end), 1e-3)))):
        flush()
        fn()
    torch.cuda.synchronize()


def graph_flush_ms(fn, flush, rotation=None, profiled=False) -> dict:
    """Per-call time of ``fn`` replayed in a CUDA graph as flush, call, flush, call ...; the flushes' own graph is
    timed alternately and subtracted. ``rotation``: callables the pairs cycle through instead of ``fn``;
    ``profiled``: replayed inside the runner's profiler session. None when the call cannot be captured (a host
    sync inside it)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls = rotation or [fn]

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
        for pair in (True, False):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(pairs):
                    flush()
                    if pair:
                        calls[i % len(calls)]()
            graphs.append(graph)
    except Exception as exc:  # noqa: BLE001 - recorded: a call a graph cannot hold has no graph figure
        torch.cuda.synchronize()
        return {"ms": None, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    both, flushes = [], []
    warm(fn, flush)
    session = profiling.profiler_session(torch.device("cuda")) if profiled else contextlib.nullcontext()
    with session, ClockSampler(torch.device("cuda")) as clocks:
        for rep in range(12):
            b, f = timed(graphs[0].replay), timed(graphs[1].replay)
            if rep >= 2:  # the first replays warm the graphs up
                both.append(b)
                flushes.append(f)
    return {
        "ms": (statistics.median(both) - statistics.median(flushes)) / pairs,
        "pairs": pairs,
        "flush_ms": statistics.median(flushes) / pairs,
        "clocks": clocks.summary(),
    }


def do_bench_read_flush(fn, flush) -> dict:
    import triton.testing
    from triton import runtime

    driver = runtime.driver.active
    zeroing = driver.clear_cache
    driver.clear_cache = lambda cache: flush()
    try:
        warm(fn, flush)
        with ClockSampler(torch.device("cuda")) as clocks:
            ms = triton.testing.do_bench(fn, return_mode="median")
    finally:
        driver.clear_cache = zeroing
    return {"ms": ms, "clocks": clocks.summary()}


def back_to_back_ms(calls, flush) -> dict:
    """The grader's scored batches (spin, warm calls, events per call) run in this process over ``calls``."""
    steps = lambda n: [(lambda: None, calls[i % len(calls)], lambda out: None) for i in range(n)]  # noqa: E731
    shape_ = timing.calibrate_batch(lambda spin_us: timing.run_batch(steps(3), "back_to_back", spin_us, flush), False)
    warm, samples = int(shape_["warm_calls"]), []
    with ClockSampler(torch.device("cuda")) as clocks:
        for _ in range(8):
            samples += timing.run_batch(
                steps(warm + int(shape_["per_batch"])), "back_to_back", shape_["spin_us"], flush
            )["ms"][warm:]
    return {"ms": statistics.median(samples), "batch": shape_, "clocks": clocks.summary()}


def probes(call, rotation, flush, l2_bytes: int) -> dict:
    """What separates the scored figure from the references: input rotation, flush strength, the process."""
    deep = L2Flush(4 * l2_bytes)
    return {
        "sets": len(rotation),
        "graph_flush_rotated": graph_flush_ms(call, flush, rotation),
        "graph_flush8x": graph_flush_ms(call, deep),
        "graph_flush8x_rotated": graph_flush_ms(call, deep, rotation),
        "graph_flush_read_twice": graph_flush_ms(call, lambda: (flush(), flush())),
        "back_to_back_one_set": back_to_back_ms([call], flush),
        "back_to_back_rotated": back_to_back_ms(rotation, flush),
    }


def outside(problem, solution: Path, shape: dict, probe: bool = False) -> dict:
    """The example solution built as the grader builds it (reference weights, seeded inputs), timed here."""
    ref = load_module("fidelity_reference", problem.grader_reference)
    sol = load_module("fidelity_solution", solution)
    torch.manual_seed(42)
    ref_model = ref.Model(*ref.get_init_inputs(dict(shape))).cuda().eval()
    model = sol.ModelNew(*ref.get_init_inputs(dict(shape))).cuda().eval()
    model.load_state_dict(ref_model.state_dict())
    torch.manual_seed(2026 + 7919)
    inputs = list(ref.get_inputs(dict(shape), torch.device("cuda")))
    l2_bytes = int(float(ROOFLINE.get("l2_mib") or 50) * 2**20)
    flush = L2Flush(l2_bytes)
    draws = []
    for seed in range(DRAWS):
        torch.manual_seed(7 + seed)
        draws.append(list(ref.get_inputs(dict(shape), torch.device("cuda"))))
    with torch.no_grad():
        call = lambda: model(*inputs)  # noqa: E731
        drawn = [lambda d=d: model(*d) for d in draws]
        # interleaved rounds: under the power cap a large GEMM's reference moves by several % from one
        # measurement to the next (the clock follows the load before it), so each reference is a median
        rounds = [
            (
                graph_flush_ms(call, flush),
                graph_flush_ms(call, flush, profiled=True),
                graph_flush_ms(call, flush, drawn),
                do_bench_read_flush(call, flush),
            )
            for _ in range(ROUNDS)
        ]
        found = {
            key: [r[i] for r in rounds]
            for i, key in enumerate(("graph_flush", "graph_flush_profiled", "graph_flush_draws", "do_bench_read_flush"))
        }
        if probe:
            count = timing.input_set_count(
                sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor)), l2_bytes
            )
            sets = [inputs] + [list(ref.get_inputs(dict(shape), torch.device("cuda"))) for _ in range(count - 1)]
            found["probe"] = probes(call, [lambda s=s: model(*s) for s in sets], flush, l2_bytes)
    return found


def median_ms(figures: list):
    valid = [f["ms"] for f in figures if f.get("ms")]
    return statistics.median(valid) if valid else None


def shape_rows(name: str, pid: str, grades: dict, local: list, host: dict) -> list:
    """One object per kernel and shape, with the fields the benchmarks table reads (scored_ms: the median of the grades)."""
    rows = []
    for index, here in enumerate(local):
        timed = {
            cond: (g["timings"][index]["candidate"] if g.get("outcome") == "pass" else {}) for cond, g in grades.items()
        }
        regrade = [t.get("median_ms") for t in timed.values()]
        valid = [m for m in regrade if m]
        scored = statistics.median(valid) if valid else None
        graph, bench = median_ms(here["graph_flush"]), median_ms(here["do_bench_read_flush"])
        profiled, drawn = median_ms(here["graph_flush_profiled"]), median_ms(here["graph_flush_draws"])
        rows.append(
            {
                "kernel": f"{name} ({pid})",
                "shape": here["shape"],
                "scored_ms": scored,
                "graph_ms": graph,
                "graph_profiled_ms": profiled,
                "graph_draws_ms": drawn,
                "do_bench_ms": bench,
                "regrade_ms": regrade,
                **{
                    f"score_{cond.replace('baselines_timed_first', 'baselines_first').replace('baselines_cached', 'cached')}": g.get(
                        "score"
                    )
                    for cond, g in grades.items()
                },
                "regrade_spread": (max(valid) - min(valid)) / statistics.mean(valid) if len(valid) > 1 else None,
                "scored_over_graph": scored / graph if scored and graph else None,
                "scored_over_graph_profiled": scored / profiled if scored and profiled else None,
                "scored_over_graph_draws": scored / drawn if scored and drawn else None,
                "scored_over_do_bench": scored / bench if scored and bench else None,
                "graph_rounds_ms": [f.get("ms") for f in here["graph_flush"]],
                "graph_profiled_rounds_ms": [f.get("ms") for f in here["graph_flush_profiled"]],
                "graph_draws_rounds_ms": [f.get("ms") for f in here["graph_flush_draws"]],
                "do_bench_rounds_ms": [f.get("ms") for f in here["do_bench_read_flush"]],
                "scored_clocks": {cond: t.get("clocks") for cond, t in timed.items()},
                "outside": here,
                "mode": next((t.get("mode") for t in timed.values() if t), None),
                "host": host,
                # which figure each grade scored (a graph replay of the calls, or their events), and the events' beside it
                "timer": [t.get("timer") for t in timed.values()],
                "events_ms": [(t.get("events") or {}).get("median_ms") for t in timed.values()],
                "replay_refused": [t.get("replay_refused") for t in timed.values() if t.get("replay_refused")],
                # how many replays (draws) each grade's median holds, and the candidate's process's own figure beside the referee's
                "replay_runs": [(t.get("replay") or {}).get("runs") for t in timed.values()],
                "runner_ms": [(t.get("corroboration") or {}).get("runner_median_ms") for t in timed.values()],
            }
        )
    return rows


def markdown(rows: list) -> str:
    """The benchmarks table: scored ms per grade, the outside references (median of rounds), the ratios the targets bound."""
    pct = lambda v: f"{(v - 1) * 100:+.1f}%" if v else "-"  # noqa: E731
    num = lambda v: f"{v:.4f}" if v else "-"  # noqa: E731
    lines = [
        "| kernel | shape | timer | scored ms (timed first / cached / none) | events ms | spread "
        "| graph+flush ms (rounds) | vs graph | graph+flush profiled ms (rounds) | vs profiled graph "
        "| graph+flush over draws ms (rounds) | vs graph over draws | do_bench read-flush ms (rounds) | vs do_bench "
        "| scores (first / cached / none) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rounds = lambda key, r=r: ", ".join(num(v) for v in r[key])  # noqa: E731
        scores = " / ".join(
            f"{r[k]:.4g}" if r.get(k) else "-" for k in ("score_baselines_first", "score_cached", "score_no_baselines")
        )
        lines.append(
            f"| {r['kernel']} | {','.join(f'{k}={v}' for k, v in r['shape'].items())} | {'/'.join(sorted(set(filter(None, r['timer']))))} | "
            f"{' / '.join(num(m) for m in r['regrade_ms'])} | {' / '.join(num(m) for m in r['events_ms'])} | "
            f"{(r['regrade_spread'] or 0) * 100:.1f}% | {num(r['graph_ms'])} ({rounds('graph_rounds_ms')}) | {pct(r['scored_over_graph'])} | "
            f"{num(r['graph_profiled_ms'])} ({rounds('graph_profiled_rounds_ms')}) | {pct(r['scored_over_graph_profiled'])} | "
            f"{num(r['graph_draws_ms'])} ({rounds('graph_draws_rounds_ms')}) | {pct(r['scored_over_graph_draws'])} | "
            f"{num(r['do_bench_ms'])} ({rounds('do_bench_rounds_ms')}) | {pct(r['scored_over_do_bench'])} | {scores} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--budget-s", type=float, default=540)
    parser.add_argument(
        "--conditions", default=",".join(c for c, _ in CONDITIONS), help="which of the three grades to run"
    )
    parser.add_argument(
        "--probe", action="store_true", help="add the cause-finding figures (see the module's docstring)"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.time()
    host = {**software_versions(), "gpu": torch.cuda.get_device_name(), "sandbox": SANDBOX_NOTE}
    report = {"host": host, "grades": {}, "rows": []}

    def save() -> None:
        (args.out / "timer_fidelity.json").write_text(json.dumps(report["rows"], indent=1, default=str))
        (args.out / "grades.json").write_text(
            json.dumps({"host": host, "grades": report["grades"]}, indent=1, default=str)
        )

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
            for cond, baselines in (c for c in CONDITIONS if c[0] in args.conditions.split(",")):
                result = grade(
                    GradeRequest(
                        problem,
                        solution,
                        GPU,
                        ROOFLINE,
                        baselines=baselines,
                        baseline_cache=cache,
                        compile_mode="default",
                        timeout_s=min(300, args.budget_s - (time.time() - began)),
                        log_dir=Path(folder) / cond,
                        sandbox=SANDBOX,
                    )
                ).to_json()
                grades[cond] = result
                report["grades"][f"{name}/{cond}"] = {
                    **{k: result.get(k) for k in ("outcome", "message", "score", "speedup", "grade_s", "startup_s")},
                    "stages": (result.get("evidence") or {}).get("stages"),
                }
                print(
                    f"[{time.time() - began:4.0f} s] {name} {cond}: {result['outcome']} score={result.get('score')} "
                    f"{[t['candidate'].get('median_ms') for t in result.get('timings') or []]} {result.get('message') or ''} "
                    f"{ {k: round(v['s'], 1) for k, v in (report['grades'][f'{name}/{cond}']['stages'] or {}).items()} }",
                    flush=True,
                )
                save()
            local = [
                {"shape": shape, **outside(problem, solution, shape, args.probe)} for shape in problem.shapes("shapes")
            ]
            report["rows"] += shape_rows(name, pid, grades, local, host)
            for row in report["rows"][-len(local) :]:
                print(
                    json.dumps(
                        {
                            k: row[k]
                            for k in (
                                "kernel",
                                "shape",
                                "regrade_ms",
                                "graph_rounds_ms",
                                "graph_profiled_rounds_ms",
                                "graph_draws_rounds_ms",
                                "do_bench_rounds_ms",
                            )
                        },
                        default=str,
                    ),
                    flush=True,
                )
                for label, figure in (row["outside"].get("probe") or {}).items():
                    print(f"  probe {label}: {figure if label == 'sets' else figure.get('ms')}", flush=True)
            save()
    (args.out / "timer_fidelity.md").write_text(markdown(report["rows"]))
    print(markdown(report["rows"]), flush=True)
    print(f"done in {time.time() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
