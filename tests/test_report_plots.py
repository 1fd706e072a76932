"""The report's plots are legible: no title, axis label, tick label, legend or annotation is cut, checked twice —
in matplotlib (every text's extent, from the renderer, inside the image the report saves; the saved image's edge
blank) and in headless Chromium (report.html's images decoded, at their natural size, inside the viewport, and a
screenshot of each showing the PNG's own pixels). KBSWEEP_SCREENSHOTS=DIR keeps the screenshots."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from kbsweep.reporting.figures import new_figure, png
from kbsweep.reporting.render import board_figures, write_report
from kbsweep.reporting.report import build_boards
from tests.test_browser_mlflow_ui import browser  # noqa: F401 (fixture)
from tests.test_report import ROWS, row

DPI = 110  # png()'s
LONG = "a-model-with-a-long-name-from-some-provider/and-its-route"
# long names, and costs and tokens whose tick labels are wide: what pushed the Pareto y-labels off the image
WIDE_ROWS = ROWS + [{**row(LONG, "hard/p1", r, score=0.42, usd=123456.78), "tokens_output": 9.87e9} for r in range(3)]


SHAPES = ["rows=8192, cols=4096", "rows=4096, cols=11008", "rows=1000, cols=1537", "rows=3000, cols=2561"]


def crowded_row(model: str, repeat: int, usd: float, score: float) -> dict:
    """A memory-bound problem's cell: every shape at one arithmetic intensity, a few percent apart in TFLOP/s."""
    found = {
        **row(model, "hard/p1", repeat, score=score, usd=usd),
        "params": {**ROWS[0]["params"], **{f"shape{i}": s for i, s in enumerate(SHAPES)}},
    }
    for i in range(len(SHAPES)):
        gbps = 1500.0 * (1 + 0.2 * i) * (1 + 0.01 * repeat)
        found.update({f"shape{i}.ms": 1.0, f"shape{i}.gbps": gbps, f"shape{i}.tflops": gbps * 0.25 / 1e3})
    return found


# what a real deck gives: free scripted models at one point, paid ones a few cents apart, repeats on top of each other
CROWDED_ROWS = [
    crowded_row(model, r, usd, score)
    for model, usd, score in (
        ("scripted", 0.0, 0.6),
        ("scripted-lazy", 0.0, 0.6),
        ("opus-4.8", 12.5, 0.62),
        ("gpt-5.5", 12.7, 0.6),
        ("glm-5.2", 3.1, 0.41),
    )
    for r in range(3)
]


def figures(rows=None):
    """Every kind of plot the report carries, named."""
    [board, *_] = build_boards(rows or WIDE_ROWS)
    return board_figures(board)


def tick_labels(axis):
    """The tick labels drawn: those of ticks inside the view (an axis keeps labels for ticks beyond it)."""
    low, high = sorted(axis.get_view_interval())
    pairs = list(zip(axis.get_majorticklocs(), axis.get_majorticklabels())) + list(
        zip(axis.get_minorticklocs(), axis.get_minorticklabels())
    )
    return [label for loc, label in pairs if low - 1e-9 * abs(high - low) <= loc <= high + 1e-9 * abs(high - low)]


def texts(figure):
    """The figure's drawn texts: titles, axis and tick labels, legend entries, annotations."""
    found = [figure._suptitle, *figure.texts]
    for ax in figure.axes:
        found += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        found += (
            tick_labels(ax.xaxis) + tick_labels(ax.yaxis) + [ax.xaxis.get_offset_text(), ax.yaxis.get_offset_text()]
        )
        if ax.get_legend():
            found += ax.get_legend().get_texts()
    return [t for t in found if t is not None and t.get_visible() and t.get_text().strip()]


def cut_texts(figure, data: bytes) -> list:
    """Texts of ``figure`` not wholly inside the image ``data`` (its PNG as png() saved it), tick labels of one axis
    that run together (as unreadable as cut ones), and the image's failures: a size other than
    the region the texts are measured against, ink on its outermost pixels."""
    from matplotlib import rcParams
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure.set_dpi(DPI)  # text extents are not linear in the dpi (hinting): measured as saved
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    inch = figure.dpi_scale_trans.inverted()
    region = figure.get_tightbbox(renderer).padded(
        rcParams["savefig.pad_inches"]
    )  # as savefig's bbox_inches="tight" crops
    image = np.asarray(Image.open(io.BytesIO(data)).convert("L"))
    found = []
    if abs(image.shape[1] - region.width * DPI) > 2 or abs(image.shape[0] - region.height * DPI) > 2:
        found.append(
            f"image {image.shape[1]}x{image.shape[0]} px, not the {region.width * DPI:.0f}x{region.height * DPI:.0f} px holding every artist"
        )
    for text in texts(figure):
        box = text.get_window_extent(renderer).transformed(inch)
        if (
            box.x0 < region.x0 - 0.01
            or box.y0 < region.y0 - 0.01
            or box.x1 > region.x1 + 0.01
            or box.y1 > region.y1 + 0.01
        ):
            found.append(
                f"text {text.get_text()!r} at {box.extents.round(2)} in, outside the saved {region.extents.round(2)}"
            )
    for ax in figure.axes:
        for axis, at in ((ax.xaxis, 0), (ax.yaxis, 1)):
            labels = [
                (label.get_window_extent(renderer), label.get_text())
                for label in tick_labels(axis)
                if label.get_text().strip()
            ]
            boxes = sorted(labels, key=lambda found: found[0].extents[at])
            for (a, name_a), (b, name_b) in zip(boxes, boxes[1:]):
                if b.extents[at] - a.extents[at + 2] < 0.3 * min(
                    a.height, b.height
                ):  # less than a third of a line apart
                    found.append(f"tick labels {name_a!r} and {name_b!r} run together")
    edge = np.concatenate([image[:2].ravel(), image[-2:].ravel(), image[:, :2].ravel(), image[:, -2:].ravel()])
    if (edge < 250).any():
        found.append(f"ink on the image's edge ({int((edge < 250).sum())} px): something runs off it")
    return found


@pytest.mark.parametrize("name", sorted(figures()))
def test_no_plot_text_is_cut(name):
    figure = figures()[name]
    assert cut_texts(figure, png(figure)) == []


def overlapping_texts(figure) -> list:
    """Pairs of drawn texts whose extents overlap (a label over another label, a tick label, a title or the legend),
    and labels over the legend's frame."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Annotation, Text

    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    unique = list({id(t): t for t in texts(figure)}.values())  # the suptitle is also among the figure's texts
    drawn = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in unique]  # an annotation's text, not its line
    found = [
        f"{a!r} over {b!r}"
        for i, (a, box_a) in enumerate(drawn)
        for b, box_b in drawn[i + 1 :]
        if box_a.overlaps(box_b)
    ]
    for ax in figure.axes:
        legend = ax.get_legend()
        for label in [t for t in ax.texts if isinstance(t, Annotation)] if legend else []:
            if Text.get_window_extent(label, renderer).overlaps(legend.get_window_extent(renderer)):
                found.append(f"{label.get_text()!r} over the legend")
    return found


@pytest.mark.parametrize("name", sorted(figures(CROWDED_ROWS)))
def test_no_plot_labels_overlap_on_a_crowded_board(name):
    """Five models, two of them at one point, three repeats each, four shapes at one arithmetic intensity: each
    label readable, none over another text or the legend, and none cut."""
    figure = figures(CROWDED_ROWS)[name]
    labels = [t.get_text() for ax in figure.axes for t in ax.texts]
    assert labels and overlapping_texts(figure) == [], labels
    assert cut_texts(figure, png(figure)) == []
    if name.startswith("roofline"):
        assert sorted(labels) == sorted(SHAPES)  # each shape once, whatever its repeats and models
    else:
        assert any(
            {"scripted", "scripted-lazy"} <= set(label.split(", ")) for label in labels
        )  # models at one point share a label


@pytest.mark.parametrize("name", sorted(figures()))
def test_no_plot_labels_overlap(name):
    assert overlapping_texts(figures()[name]) == []


def test_the_check_sees_a_cut_label():
    """Negative control: a y-label pushed off a figure saved at its own size (no tight box) is reported."""
    figure, ax = new_figure("clipped")
    ax.plot([0, 1], [0, 123456789])
    ax.set_ylabel("a y label far too large for the margin", fontsize=30)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    found = cut_texts(figure, buffer.getvalue())
    assert any("image" in f for f in found) and any("ink on the image's edge" in f for f in found)


def test_report_plots_are_whole_in_chromium(browser, tmp_path):  # noqa: F811 (fixture)
    from selenium.webdriver.common.by import By

    paths = write_report(build_boards(WIDE_ROWS), tmp_path / "report")
    browser.set_window_size(1400, 1000)
    browser.get(paths["html"].resolve().as_uri())
    images = browser.find_elements(By.TAG_NAME, "img")
    saved = sorted((tmp_path / "report" / "plots").rglob("*.png"))
    assert len(images) == len(saved) == 4
    keep = Path(os.environ["KBSWEEP_SCREENSHOTS"]) if os.environ.get("KBSWEEP_SCREENSHOTS") else None
    for image in images:
        name = image.get_attribute("alt")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'center'})", image)
        box = browser.execute_script(
            "const r = arguments[0].getBoundingClientRect();"
            "return {left: r.left, top: r.top, right: r.right, bottom: r.bottom, width: r.width, height: r.height,"
            " natural: [arguments[0].naturalWidth, arguments[0].naturalHeight], complete: arguments[0].complete,"
            " view: [document.documentElement.clientWidth, document.documentElement.clientHeight], dpr: window.devicePixelRatio}",
            image,
        )
        assert box["complete"] and box["natural"][0] > 0, f"{name}: not decoded"
        assert (round(box["width"]), round(box["height"])) == tuple(box["natural"]), (
            f"{name}: shown at {box['width']}x{box['height']}, not its natural {box['natural']}"
        )
        assert (
            box["left"] >= 0 and box["top"] >= 0 and box["right"] <= box["view"][0] and box["bottom"] <= box["view"][1]
        ), f"{name}: {box} leaves the viewport"
        shot = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB")
        if keep:
            keep.mkdir(parents=True, exist_ok=True)
            shot.save(keep / f"report_{name}.png")
        scale = box["dpr"]
        seen = np.asarray(
            shot.crop(tuple(round(v * scale) for v in (box["left"], box["top"], box["right"], box["bottom"]))).resize(
                tuple(box["natural"])
            ),
            dtype=float,
        )
        [source] = [p for p in saved if p.stem == name]
        own = np.asarray(Image.open(source).convert("RGB"), dtype=float)
        assert seen.shape == own.shape and np.abs(seen - own).mean() < 4, (
            f"{name}: the screenshot does not show the whole plot"
        )
    if keep:
        shutil.copy(paths["html"], keep / "report.html")
