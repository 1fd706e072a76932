"""The plots that explain a report: shapes under the GPU's roofline, capability against cost with its Pareto
frontier. Matplotlib's Figure without pyplot: no global state, Agg canvas."""

from __future__ import annotations

import io
import math
from typing import Any, Dict, List, Tuple

Point = Tuple[float, float]
DPI = 110  # what png() saves at, and what labels are placed at (a text's extent is not linear in the dpi)


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

    figure = Figure(figsize=(5.5, 4.2), dpi=DPI)
    ax = figure.subplots()
    figure.subplots_adjust(left=0.15, right=0.96, bottom=0.12, top=0.9)
    figure.suptitle(title)
    ax.ticklabel_format(
        style="sci", scilimits=(-3, 4)
    )  # past 10^4 a linear axis counts in powers of ten: six-digit tick labels (dollars, tokens) ran together
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
        ax.plot(
            xs,
            np.minimum(peak, xs * dram / 1e3),
            color="black",
            label=f"roof: {peak_key} {peak:g} TFLOP/s, {dram:g} GB/s",
        )
    at: Dict[str, List[Point]] = {}  # each shape's points, every model's and repeat's
    for model, points in series.items():
        ax.scatter([p["intensity"] for p in points], [p["tflops"] for p in points], label=model, zorder=3)
        for p in points:
            at.setdefault(p["shape"], []).append((p["intensity"], p["tflops"]))
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (
        ax.xaxis,
        ax.yaxis,
    ):  # minor ticks at 2 and 5 of each decade, not 2..9: each tick is an artist, and they were most of the plot's cost
        axis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    outside_legend(ax)
    # a shape's label once, at the geometric middle of its points (repeats and models land on nearly the same one)
    mean = lambda pts, i: math.exp(sum(math.log(v[i]) for v in pts) / len(pts))  # noqa: E731 - of coordinate i
    place_labels(figure, ax, [(mean(pts, 0), mean(pts, 1), shape) for shape, pts in at.items()], fontsize=6)
    return figure


def frontier_figure(title: str, xlabel: str, points: Dict[str, Point]):
    """Capability against a cost, one point per model, with the Pareto frontier drawn through."""
    figure, ax = new_figure(title)
    same: Dict[Point, List[str]] = {}  # models at one point (two free scripted models, say) share one label
    for name, (x, y) in points.items():
        ax.scatter([x], [y], zorder=3)
        same.setdefault((x, y), []).append(name)
    front = [points[name] for name in pareto(points)]
    ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="tab:red", label="Pareto frontier")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("deck mean (failures as 0)")
    outside_legend(ax)
    place_labels(figure, ax, [(x, y, ", ".join(names)) for (x, y), names in same.items()], fontsize=8)
    return figure


def outside_legend(ax) -> None:
    """The legend right of the axes, where no point, line or label can lie under it (the saved image widens)."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def place_labels(figure, ax, labels: List[Tuple[float, float, str]], fontsize: float) -> None:
    """Label each point (x, y, text) beside it, inside the axes and never over another label: one that would overlap
    a label placed before moves up past it (down, where up leaves the axes; left of its point, where right does),
    joined to its point by a thin line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    renderer = FigureCanvasAgg(figure).get_renderer()
    ax.autoscale_view()  # the limits the saved figure has: label positions are measured in them
    frame = ax.get_window_extent(renderer)
    to_points = 72.0 / figure.dpi
    placed: List[Any] = []

    def box(label):  # the text's own extent (an annotation's includes its line to the point)
        label.update_positions(renderer)
        return Text.get_window_extent(label, renderer)

    def fits(found) -> bool:
        return frame.y0 <= found.y0 and found.y1 <= frame.y1 and not any(found.overlaps(other) for other in placed)

    for x, y, text in sorted(labels, key=lambda label: (label[1], label[0])):
        label = ax.annotate(
            text,
            (x, y),
            xytext=(4, 3),
            textcoords="offset points",
            fontsize=fontsize,
            zorder=4,
            bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},  # legible over a line
            arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.5, "shrinkA": 0, "shrinkB": 3},
        )
        if box(label).x1 > frame.x1:  # past the right edge (the legend's side): left of the point
            label.set_horizontalalignment("right")
            label.xyann = (-4, 3)
        height = box(label).height * to_points
        for direction in (1, -1):
            label.xyann = (label.xyann[0], 3 if direction > 0 else -3 - height)
            for _ in range(len(placed) + 1):
                clash = [other for other in placed if box(label).overlaps(other)]
                if not clash:
                    break
                found = box(label)
                step = (
                    (max(o.y1 for o in clash) - found.y0 + 1)
                    if direction > 0
                    else (min(o.y0 for o in clash) - found.y1 - 1)
                )
                label.xyann = (label.xyann[0], label.xyann[1] + step * to_points)
            if fits(box(label)):
                break
        placed.append(box(label))


def png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(
        buffer, format="png", dpi=DPI, bbox_inches="tight"
    )  # long tick labels widen the image, never clipped
    return buffer.getvalue()
