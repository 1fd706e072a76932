"""A profile grade's summary for the agent (``run_profile``): bounded plain text, written on the trusted side from
the referee's message.

The time per call and the achieved rates are the referee's clock (as ``run_benchmark`` reports them) against the
problem's FLOP and byte formulas and the GPU's datasheet peaks (``roofline_specs/``). The table below them is the
candidate process's own profiler view: per GPU kernel, or on CPU per outermost torch op with the rest of the calls'
time (Python, Triton's interpreter) in a row of its own. It is never scored, and says so. Nothing in it names the
referee's command ids, its stages or its seeds.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

TOP = 15  # rows of the table before "others"
NAME_CHARS = 60
OUTSIDE_OPS = "(outside torch ops: Python, interpreter)"
CPU_LABEL = "CPU: interpreter/op view, not GPU kernels"


def short(name: str) -> str:
    """A kernel's or op's name cut to one column (a C++ template name runs to hundreds of characters)."""
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 3] + "..."


def percent(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{100 * value:.3g}%"


def rate_lines(shape: Any, roofline: Dict[str, Any], regime: str) -> List[str]:
    """Achieved GB/s and TFLOP/s with the fractions of the datasheet peaks, and which roof governs the problem."""
    peak = f" (peak {roofline['dram_gbps']:g} GB/s)" if roofline.get("dram_gbps") else ""
    gbps = (
        "n/a (no byte formula)"
        if shape.gbps is None
        else f"{shape.gbps:.4g} GB/s = {percent(shape.memory_fraction)} of peak{peak}"
    )
    tflops = (
        "n/a (no FLOP formula)"
        if shape.tflops is None
        else f"{shape.tflops:.4g} TFLOP/s = {percent(shape.compute_fraction)} of peak"
    )
    return [f"memory:  {gbps}", f"compute: {tflops}", f"regime: {regime} (roofline fraction {percent(shape.fraction)})"]


def table(entries: Sequence[tuple], calls: int, what: str) -> List[str]:
    """``entries`` (name, calls, total ms) as rows of share, total, mean per call of the candidate and calls, the
    top :data:`TOP` then one row of the others; shares of the table's total."""
    total = sum(ms for _, _, ms in entries) or 1e-12
    ranked = sorted(entries, key=lambda entry: -entry[2])
    shown, rest = ranked[:TOP], ranked[TOP:]
    if rest:
        shown.append((f"others ({len(rest)})", sum(n for _, n, _ in rest), sum(ms for _, _, ms in rest)))
    lines = [f"  {'share':>7} {'total ms':>10} {'ms/call':>10} {'count':>7}  {what}"]
    for name, count, ms in shown:
        lines.append(f"  {100 * ms / total:6.1f}% {ms:10.4g} {ms / calls:10.4g} {count:7d}  {short(name)}")
    return lines


def summary(
    result: Any, view: Optional[Dict[str, Any]], roofline: Dict[str, Any], regime: str, ncu_lines: Sequence[str]
) -> Dict[str, Any]:
    """``{"summary": text}`` of a passed profile grade (``result``, its one timed and scored shape); ``view``: the
    referee's :func:`~kbsweep.grader.referee.profile_view.profile_view`; ``ncu_lines``: Nsight Compute's, or
    the one line saying why there are none."""
    timed, shape = result.timings[0], result.shapes[0]
    figure = timed["candidate"]
    gpu = result.device == "cuda"
    lines = [
        f"profile of solution.py on shape {shape.shape} ({result.gpu})",
        f"time per call: {figure['median_ms']:.4g} ms (the grader's clock, as run_benchmark times it; not a score)",
    ]
    lines += rate_lines(shape, roofline, regime)
    if view is None:
        lines.append("profiler: the candidate's process recorded nothing of the timed calls")
    else:
        calls = int(view["calls"])
        if gpu:
            launches = view.get("launches_per_call")
            kernels = view.get("kernels") or []
            device_ms = sum(ms for _, _, ms in kernels) / calls
            lines.append(
                f"kernels launched per call: {launches:.3g}"
                if launches is not None
                else "kernels launched per call: n/a"
            )
            lines.append(
                f"GPU time per call: {device_ms:.4g} ms (its kernels' times, the candidate process's profiler)"
            )
            lines.append(f"per GPU kernel, {calls} timed calls (the candidate process's profiler view; never scored):")
            lines += table(kernels, calls, "kernel")
        else:
            ops = list(view.get("ops") or [])
            outside = max(float(view.get("range_ms") or 0.0) - sum(ms for _, _, ms in ops), 0.0)
            own = view.get("own_launches_per_call")
            lines.append(
                f"own kernel launches per call: {own:.3g}" if own is not None else "own kernel launches per call: n/a"
            )
            lines.append(
                f"{CPU_LABEL}; per torch op, {calls} timed calls (the candidate process's profiler view; never scored):"
            )
            lines += table(ops + [(OUTSIDE_OPS, calls, outside)], calls, "op")
    lines += list(ncu_lines)
    return {"summary": "\n".join(lines)}
