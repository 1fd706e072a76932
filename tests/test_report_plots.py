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


def figures():
    """Every kind of plot the report carries, named."""
    [board, *_] = build_boards(WIDE_ROWS)
    return board_figures(board)


def tick_labels(axis):
    """The tick labels drawn: those of ticks inside the view (an axis keeps labels for ticks beyond it)."""
    low, high = sorted(axis.get_view_interval())
    pairs = list(zip(axis.get_majorticklocs(), axis.get_majorticklabels())) + list(zip(axis.get_minorticklocs(), axis.get_minorticklabels()))
    return [label for loc, label in pairs if low - 1e-9 * abs(high - low) <= loc <= high + 1e-9 * abs(high - low)]


def texts(figure):
    """The figure's drawn texts: titles, axis and tick labels, legend entries, annotations."""
    found = [figure._suptitle, *figure.texts]
    for ax in figure.axes:
        found += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        found += tick_labels(ax.xaxis) + tick_labels(ax.yaxis) + [ax.xaxis.get_offset_text(), ax.yaxis.get_offset_text()]
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
    region = figure.get_tightbbox(renderer).padded(rcParams["savefig.pad_inches"])  # as savefig's bbox_inches="tight" crops
    image = np.asarray(Image.open(io.BytesIO(data)).convert("L"))
    found = []
    if abs(image.shape[1] - region.width * DPI) > 2 or abs(image.shape[0] - region.height * DPI) > 2:
        found.append(f"image {image.shape[1]}x{image.shape[0]} px, not the {region.width * DPI:.0f}x{region.height * DPI:.0f} px holding every artist")
    for text in texts(figure):
        box = text.get_window_extent(renderer).transformed(inch)
        if box.x0 < region.x0 - 0.01 or box.y0 < region.y0 - 0.01 or box.x1 > region.x1 + 0.01 or box.y1 > region.y1 + 0.01:
            found.append(f"text {text.get_text()!r} at {box.extents.round(2)} in, outside the saved {region.extents.round(2)}")
    for ax in figure.axes:
        for axis, at in ((ax.xaxis, 0), (ax.yaxis, 1)):
            labels = [(label.get_window_extent(renderer), label.get_text()) for label in tick_labels(axis) if label.get_text().strip()]
            boxes = sorted(labels, key=lambda found: found[0].extents[at])
            for (a, name_a), (b, name_b) in zip(boxes, boxes[1:]):
                if b.extents[at] - a.extents[at + 2] < 0.3 * min(a.height, b.height):  # less than a third of a line apart
                    found.append(f"tick labels {name_a!r} and {name_b!r} run together")
    edge = np.concatenate([image[:2].ravel(), image[-2:].ravel(), image[:, :2].ravel(), image[:, -2:].ravel()])
    if (edge < 250).any():
        found.append(f"ink on the image's edge ({int((edge < 250).sum())} px): something runs off it")
    return found


@pytest.mark.parametrize("name", sorted(figures()))
def test_no_plot_text_is_cut(name):
    figure = figures()[name]
    assert cut_texts(figure, png(figure)) == []


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
            " view: [document.documentElement.clientWidth, document.documentElement.clientHeight], dpr: window.devicePixelRatio}", image)
        assert box["complete"] and box["natural"][0] > 0, f"{name}: not decoded"
        assert (round(box["width"]), round(box["height"])) == tuple(box["natural"]), f"{name}: shown at {box['width']}x{box['height']}, not its natural {box['natural']}"
        assert box["left"] >= 0 and box["top"] >= 0 and box["right"] <= box["view"][0] and box["bottom"] <= box["view"][1], f"{name}: {box} leaves the viewport"
        shot = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB")
        if keep:
            keep.mkdir(parents=True, exist_ok=True)
            shot.save(keep / f"report_{name}.png")
        scale = box["dpr"]
        seen = np.asarray(shot.crop(tuple(round(v * scale) for v in (box["left"], box["top"], box["right"], box["bottom"])))
                          .resize(tuple(box["natural"])), dtype=float)
        [source] = [p for p in saved if p.stem == name]
        own = np.asarray(Image.open(source).convert("RGB"), dtype=float)
        assert seen.shape == own.shape and np.abs(seen - own).mean() < 4, f"{name}: the screenshot does not show the whole plot"
    if keep:
        shutil.copy(paths["html"], keep / "report.html")
