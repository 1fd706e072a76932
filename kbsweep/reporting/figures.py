"""The plots that explain a report: shapes under the GPU's roofline, capability against cost with its Pareto
frontier. Matplotlib's Figure without pyplot: no global state, Agg canvas."""
from __future__ import annotations

import io
import math
from typing import Any, Dict, List, Tuple

Point = Tuple[float, float]


def pareto(points: Dict[str, Point]) -> List[str]:
    """Names on the frontier: no other point costs as little (x) and scores at least as much (y)."""
    frontier, best = [], -math.inf
    for name, (_, y) in sorted(points.items(), key=lambda item: (item[1][0], -item[1][1])):
        if y > best:
            frontier.append(name)
            best = y
    return frontier


def roofline_of(params: Dict[str, str]) -> Dict[str, Any]:
    """The GPU's peaks and the problem's governing peak, from a cell run's params."""
    prefix = "roofline.peaks_tflops."
    peaks = {k[len(prefix) :]: float(v) for k, v in params.items() if k.startswith(prefix) and v not in ("None", "")}
    dram = params.get("roofline.dram_gbps")
    return {
        "name": params.get("roofline.name"),
        "peaks_tflops": peaks,
        "dram_gbps": float(dram) if dram not in (None, "None") else None,
        "peak": params.get("problem.peak"),
    }


def new_figure(title: str):
    """A figure of one axes, its margins fixed (a layout engine costs more than the plot); returns (figure, axes)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas

    figure = Figure(figsize=(5.5, 4.2))
    ax = figure.subplots()
    figure.subplots_adjust(left=0.15, right=0.96, bottom=0.12, top=0.9)
    figure.suptitle(title)
    ax.ticklabel_format(style="sci", scilimits=(-3, 4))  # past 10^4 a linear axis counts in powers of ten: six-digit tick labels (dollars, tokens) ran together
    return figure, ax


def roofline_figure(title: str, series: Dict[str, List[Dict[str, Any]]], roofline: Dict[str, Any]):
    """Achieved TFLOP/s against arithmetic intensity, per shape, under the GPU's memory and compute roofs."""
    import numpy as np
    from matplotlib.ticker import LogLocator

    figure, ax = new_figure(title)
    peaks, dram = roofline["peaks_tflops"], roofline["dram_gbps"]
    peak_key = roofline["peak"] if roofline["peak"] in peaks else max(peaks, key=peaks.get, default=None)
    intensities = [p["intensity"] for points in series.values() for p in points]
    if peak_key and dram:
        peak = peaks[peak_key]
        ridge = peak * 1e3 / dram
        xs = np.geomspace(min(intensities + [ridge]) / 8, max(intensities + [ridge]) * 8, 200)
        ax.plot(xs, np.minimum(peak, xs * dram / 1e3), color="black", label=f"roof: {peak_key} {peak:g} TFLOP/s, {dram:g} GB/s")
    for model, points in series.items():
        ax.scatter([p["intensity"] for p in points], [p["tflops"] for p in points], label=model, zorder=3)
        for p in points:
            ax.annotate(p["shape"], (p["intensity"], p["tflops"]), fontsize=6, alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # minor ticks at 2 and 5 of each decade, not 2..9: each tick is an artist, and they were most of the plot's cost
        axis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.legend(fontsize=7)
    return figure


def frontier_figure(title: str, xlabel: str, points: Dict[str, Point]):
    """Capability against a cost, one point per model, with the Pareto frontier drawn through."""
    figure, ax = new_figure(title)
    for name, (x, y) in points.items():
        ax.scatter([x], [y], zorder=3)
        ax.annotate(name, (x, y), fontsize=8)
    front = [points[name] for name in pareto(points)]
    ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="tab:red", label="Pareto frontier")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("deck mean (failures as 0)")
    ax.legend(fontsize=7)
    return figure


def png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")  # long tick labels widen the image, never clipped
    return buffer.getvalue()
