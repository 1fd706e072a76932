"""Runs on the lent GPU: the audit's dynamic layer on real kernels (docs/audit.md; results for docs/benchmarks.md).

    python3 scripts/audit_gpu_check.py OUT_DIR [BUDGET_S]

Grades legitimate solutions and the exploits whose dynamic checks need a GPU (side stream, L2 persistence,
vendor kernels behind a fig leaf or a C++ shim, a background thread, an output cache, patched timers) on each
problem's first real shape, in bench mode (correctness, timing and the profiler pass; no baselines), and audits
them. After every case it rewrites OUT_DIR/audit_gpu.json (grades and audits) and OUT_DIR/audit_gpu.md (the
summary table: what the profiler and the ghost replays saw), so a run cut short keeps what it measured. No case
starts after BUDGET_S (default 420); each grade gets what is left of it.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from gpu_common import GPU, REPO, ROOFLINE, SANDBOX, SANDBOX_NOTE

from kbsweep.audit.cases import run_case

TIMING = {"min_runs": 3, "max_runs": 20, "max_time_s": 0.5}
BUDGET_S, MIN_CASE_S = 420, 40
CASES = [  # (file, dynamic findings expected on the GPU; "clean" for a legitimate solution); most telling first
    ("tests/exploits/listener_thread_numpy.py", "host_thread_cpu"),
    ("tests/exploits/graph_of_library_ops.py", "no_kernel"),
    ("tests/legit/scale_shift_graph_replay.py", "clean"),
    ("tests/exploits/side_stream.py", ""),  # static's: the referee's clock spans the side stream (nothing gained)
    ("tests/exploits/reference_resubmission.py", "forbidden_kernel ghost_unchanged"),
    ("tests/legit/fp8_gemm_fast.py", "clean"),
    ("tests/legit/w4a16_cuda_graph.py", "clean"),
    ("tests/exploits/fig_leaf_kernel.py", "forbidden_kernel forbidden_op"),
    ("tests/exploits/hash_cache.py", ""),  # fails its checks (incorrect) on a GPU: nothing for the dynamic layer to add
    ("tests/exploits/background_thread.py", "thread_outlived_call"),
    ("tests/exploits/l2_persistence.py", "persisting_l2"),
    ("tests/exploits/timer_patch.py", ""),  # static: a patched timer gains nothing from the referee's clock
    ("tests/legit/paged_attention_split_kv.py", "clean"),
    ("tests/exploits/cpp_at_matmul.py", "forbidden_kernel forbidden_op"),  # last: builds a C++ extension
]


def observed(result: dict, audited: dict) -> dict:
    """What the dynamic layer saw for one case, compactly."""
    evidence = result.get("evidence") or {}
    probe = evidence.get("probe") or {}
    timing = (result.get("timings") or [{}])[0]
    candidate = timing.get("candidate") or {}
    profile = timing.get("profile") or {}
    return {
        "outcome": result["outcome"],
        "message": (result.get("message") or "")[:200],
        "verdict": audited["verdict"],
        "dynamic": sorted({f["kind"] for f in audited["findings"] if f["layer"] == "dynamic" and f["verdict"]}),
        "static": sorted({f["kind"] for f in audited["findings"] if f["layer"] == "static" and f["verdict"]}),
        "launches": probe.get("launches"),
        "aten_ops": probe.get("aten_ops"),
        "torch_flop_share": (probe.get("work") or {}).get("flop_share"),  # the most any counted call did
        "host_bytes": (probe.get("work") or {}).get("host_bytes"),
        "ghost": probe.get("ghost"),
        "persisting_l2_limit": probe.get("persisting_l2_limit"),
        "profiled_kernels": profile.get("kernels"),
        "streams": profile.get("streams"),
        "scored_ms": candidate.get("median_ms"),  # the referee's clock
        "runner_ms": (candidate.get("corroboration") or {}).get(
            "runner_median_ms"
        ),  # the candidate's process's own figure
        "threads": evidence.get("threads"),
        "others_cpu_ms": [
            b[-1] for b in (candidate.get("corroboration") or {}).get("batches") or []
        ],  # per batch, from /proc
    }


def ghost_text(ghost: dict) -> str:
    if not ghost:
        return "-"
    same, fresh = ghost["same_instance"], ghost["fresh_instance"]
    return (
        f"same: {'changed' if same['changed'] else 'UNCHANGED'} ({same['stubbed']} stubbed, {same['graph_replays']} replays); "
        f"fresh: {'changed' if fresh['changed'] else 'UNCHANGED'} ({fresh['stubbed']} stubbed)"
    )


def markdown(rows: list) -> str:
    lines = [
        "| case | expected | outcome | verdict | dynamic findings | kernels per timed call (profiler) | streams | scored / runner's ms | ghost replays |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        seen = row["seen"]
        kernels = (
            ", ".join(f"`{name[:48]}` x{count:g}" for name, count in (seen["profiled_kernels"] or {}).items()) or "-"
        )
        times = f"{seen['scored_ms']:.3f} / {seen['runner_ms'] or 0:.3f}" if seen["scored_ms"] else "-"
        lines.append(
            f"| {row['case']} | {row['expected']} | {seen['outcome']} | {seen['verdict']} | {', '.join(seen['dynamic']) or '-'} "
            f"| {kernels} | {seen['streams'] or '-'} | {times} | {ghost_text(seen['ghost'])} |"
        )
    return "\n".join(lines) + "\n"


def main(out: Path, budget_s: float) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    rows, full, began = [], [], time.time()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; {SANDBOX_NOTE}", flush=True)
    for name, expected in CASES:
        left = budget_s - (time.time() - began)
        if left < MIN_CASE_S:
            print(f"skipped {name}: {left:.0f} s of the budget left", flush=True)
            continue
        started = time.time()
        with tempfile.TemporaryDirectory() as folder:
            meta, result, audited = run_case(
                REPO / name,
                Path(folder),
                GPU,
                ROOFLINE,
                REPO / "problems",
                mode="bench",
                timing=TIMING,
                max_shapes=1,
                timeout_s=left,
                sandbox=SANDBOX,
            )
        seen = observed(result, audited)
        wanted = set(expected.split()) - {"clean"}
        ok = seen["verdict"] == "clean" if expected == "clean" else wanted <= set(seen["dynamic"])
        rows.append(
            {
                "case": Path(name).stem,
                "expected": expected,
                "ok": ok,
                "seconds": round(time.time() - started),
                "seen": seen,
            }
        )
        full.append({"case": name, "meta": meta, "grade": result, "audit": audited})
        print(
            f"[{time.time() - began:4.0f} s] {'ok ' if ok else 'OFF'} {Path(name).stem}: {seen['outcome']} {seen['verdict']} "
            f"dynamic={seen['dynamic']} {ghost_text(seen['ghost'])}",
            flush=True,
        )
        (out / "audit_gpu.json").write_text(json.dumps({"rows": rows, "cases": full}, indent=1, default=str))
        (out / "audit_gpu.md").write_text(markdown(rows))
    print(markdown(rows), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else BUDGET_S)
