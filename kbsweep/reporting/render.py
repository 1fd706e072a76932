"""The report's outputs: a rich terminal table, Markdown, JSON and one static HTML page with the plots embedded
(roofline per problem, capability against dollars and against output tokens with their Pareto frontiers)."""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import math
import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from kbsweep.reporting.figures import frontier_figure, png, roofline_figure
from kbsweep.reporting.report import FAST_P, natural

TERMINAL_WIDTH = 120  # a large deck's board (compact) fits it
MAX_PROBLEM_COLUMNS = 12  # a larger deck shows per-level aggregates in the terminal, per-problem cells in report.html


def kernelbench_table(board: Dict[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """KernelBench's metrics per entrant and level; on a CPU board its verdict and timings are marked ``(cpu)``
    (:data:`KB_CPU_NOTE` says why)."""
    cpu = " (cpu)" if board.get("cpu") else ""
    header = [
        "model",
        "harness",
        "level",
        "cells",
        f"KB correct{cpu}",
        "kbsweep pass",
        *[f"fast_{p:g}{cpu}" for p in FAST_P],
        f"geomean eager{cpu}",
        f"geomean compile{cpu}",
    ]
    rows = [
        [
            e["model"],
            e["harness"],
            e["level"],
            str(e["cells"]),
            str(e["correct"]),
            str(e["kbsweep_passed"]),
            *[fmt(e[f"fast_{p:g}"]) for p in FAST_P],
            fmt(e["geomean_eager"]),
            fmt(e["geomean_compile"]),
        ]
        for e in board.get("kernelbench") or []
    ]
    return header, rows


def fmt(value: Optional[float]) -> str:
    """``value`` to 3 significant figures in positional notation, trailing zeros dropped (0.0000512, 0.267, 12.3,
    123457: every integer digit kept): a column a reader compares at a glance, never an exponent a narrow column cuts."""
    if value is None:
        return "–"
    if value == 0 or not math.isfinite(value):
        return format(value, "g")
    rounded = float(format(value, ".3g"))  # 0.9996 rounds to 1.00, whose decimals it keeps
    text = format(value, f".{max(0, 2 - math.floor(math.log10(abs(rounded))))}f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def board_table(
    board: Dict[str, Any], per_problem: bool = True, compact: bool = False
) -> Tuple[List[str], List[List[str]]]:
    """Header and rows of a board, shared by every renderer: a row per entrant (model and harness in columns of
    their own), ranked, then those with nothing scored, unranked (``–``) with their infra count. A flagged best
    shows as ``DQ(score)``, counted 0. ``per_problem`` False (a deck over MAX_PROBLEM_COLUMNS): no column per
    problem but one row per entrant and level with the level's aggregates (kbsweep passes / cells, fast_1, fast_2,
    geomean speedup over eager), the entrant's own figures on its first row (report.html keeps the problems, as a
    heatmap). ``compact``: the terminal's columns only (rank, model, harness, the level aggregates, deck mean,
    infra; pass@1 and dollars are in the report files), within TERMINAL_WIDTH whatever the number of levels."""
    k = board["k"]
    cpu = " (cpu)" if board.get("cpu") else ""
    deck = board["deck"] if per_problem else []
    levels = [] if per_problem else sorted({c["level"] for c in board["cells"]}, key=natural)
    header = ["rank", "model", "harness", *[f"{p.split('/')[-1]} mean" for p in deck]]
    header += ["level", "passed", f"fast_1{cpu}", f"fast_2{cpu}", f"geomean{cpu}"] if levels else []
    held_out = any(e["held_out_cells"] for e in board["models"])  # the columns of boards with held-out shapes graded
    tail = (
        ["deck mean ± CI95", "pass@1"]
        + [f"pass@{k}"] * (k > 1)
        + HELD_OUT_COLUMNS * held_out
        + ["passed/cells", "flagged", "infra", "out tokens", "$", "$/pass", "out tok/pass"]
    )
    keep = [i for i, name in enumerate(tail) if not compact or name in ("deck mean ± CI95", "held-out gap", "infra")]
    header += [tail[i] for i in keep]
    rows = []
    for e in board["models"]:
        scores = []
        for p in deck:
            if p in e["best"]:
                scores.append(fmt(e["means"][p]))
            elif p in e["flagged"]:
                scores.append(f"DQ({fmt(e['flagged'][p]['score'])})")
            else:
                scores.append("0")
        spread = f"{fmt(e['deck_mean'])} ± {fmt(e['deck_ci95'])} (n={e['repeats']})"
        values = (
            [spread, fmt(e["pass_at_1"])]
            + [fmt(e["pass_at_k"])] * (k > 1)
            + [fmt(e["public_mean"]), fmt(e["held_out_mean"]), fmt(e["held_out_gap"])] * held_out
            + [
                f"{e['passed']}/{e['cells']}",
                str(e["flagged_cells"]),
                str(e["infra"]),
                fmt(e["tokens_output"]),
                fmt(e["usd"]),
                fmt(e["usd_per_pass"]),
                fmt(e["tokens_output_per_pass"]),
            ]
        )
        own = [values[i] for i in keep]
        names = [str(e["rank"]), e["model"], e["harness"]]
        if not levels:
            rows.append([*names, *scores, *own])
        for n, level in enumerate(lv for lv in levels if lv in board["levels"].get(e["entrant"], {})):
            a = board["levels"][e["entrant"]][level]
            aggregates = [level, f"{a['passed']}/{a['cells']}", fmt(a["fast_1"]), fmt(a["fast_2"]), fmt(a["geomean"])]
            rows.append((names if n == 0 else ["", "", ""]) + aggregates + (own if n == 0 else [""] * len(own)))
    for e in board.get("unscored") or []:
        values = [str(e["infra"]) if name == "infra" else "–" for name in tail]
        rows.append(
            [
                "–",
                e["model"],
                e["harness"],
                *["–"] * len(deck),
                *[""] * (5 if levels else 0),
                *[values[i] for i in keep],
            ]
        )
    return header, rows


HELD_OUT_COLUMNS = ["public mean", "held-out mean", "held-out gap"]
SEVERITY = ("reward_hack", "contaminated", "rubric_leak", "needs_human")  # worst first
MAX_FLAGGED = 20  # rows of the audit-flagged table; report.json keeps every cell


def flagged_table(board: Dict[str, Any], limit: int = MAX_FLAGGED) -> Tuple[List[str], List[List[str]]]:
    """Results the audit did not clear, shown and never ranked: worst first (by verdict in :data:`SEVERITY`
    order, then the higher score), at most ``limit`` rows, then one counting the rest."""

    def worst(cell: Dict[str, Any]) -> tuple:
        verdict = str(cell["verdict"])
        return (
            SEVERITY.index(verdict) if verdict in SEVERITY else len(SEVERITY),
            -(cell["score"] or 0.0),
            cell["entrant"],
            natural(cell["problem"]),
            str(cell["repeat"]),
        )

    flagged = sorted((c for c in board["cells"] if c["flagged"]), key=worst)
    rows = [
        [c["model"], c["harness"], c["problem"], str(c["repeat"]), str(c["verdict"]), fmt(c["score"]), c["run_id"]]
        for c in flagged[:limit]
    ]
    if len(flagged) > limit:
        rows.append([f"… and {len(flagged) - limit} more", "", "", "", "", "", ""])
    return ["model", "harness", "problem", "repeat", "verdict", "score (not ranked)", "run"], rows


MEANING = (
    "scores: the mean over repeats of each cell's valid score (a failure, a missing cell or a flagged pass "
    "counts 0; DQ(x): only a flagged pass, of score x); deck mean: over the deck's problems, with the 95% Student-t "
    "interval over the n repeats' deck means; public/held-out mean and gap (public minus held-out): over the valid "
    "passes graded on held-out shapes, which the agent never saw; infra: cells left in an infrastructure outcome, never scored, run "
    "again by the sweep's next run"
)
CPU_NOTE = (
    "cpu: plumbing only: graded on a CPU (Triton's interpreter, smoke sizes), so scores, speedups and fast_p "
    "check the code paths and are noise as kernel performance"
)
KB_CPU_NOTE = (
    f"{CPU_NOTE}; KernelBench's verdict here is computed at shrunk sizes (docs/kernelbench.md) and can differ "
    "from KernelBench's at the real size"
)


def board_note(board: Dict[str, Any]) -> str:
    """What a board's table means: :data:`MEANING`, or that nothing was scored and why; :data:`CPU_NOTE` on a CPU."""
    note = MEANING
    if not board["models"]:
        outcomes: Counter = Counter()
        for entry in board.get("unscored") or []:
            outcomes.update(entry["outcomes"])
        listed = ", ".join(f"{o} {n}" for o, n in sorted(outcomes.items()))
        note = (
            f"nothing scored: all {sum(outcomes.values())} cells ended in an infrastructure outcome ({listed}); "
            "never scored, run again by the sweep's next run"
        )
    return f"{note}. {CPU_NOTE}" if board.get("cpu") else note


def kernelbench_note(board: Dict[str, Any]) -> Optional[str]:
    return KB_CPU_NOTE if board.get("cpu") else None


def regrade_table(board: Dict[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """The sweep's score of each regraded solution beside its regrade's (on its GPU), and their ratio."""
    rows = []
    for r in board.get("regrades") or []:
        ratio = r["score"] / r["old_score"] if r["score"] is not None and r["old_score"] else None
        rows.append(
            [
                r["model"],
                r["harness"],
                r["problem"],
                str(r["repeat"]),
                f"{r['old_outcome']} {fmt(r['old_score'])} ({r['old_gpu']})",
                f"{r['outcome']} {fmt(r['score'])} ({r['gpu']})",
                fmt(ratio),
            ]
        )
    return [
        "model",
        "harness",
        "problem",
        "repeat",
        "sweep: outcome score (GPU)",
        "regrade: outcome score (GPU)",
        "regrade / sweep",
    ], rows


def board_title(board: Dict[str, Any]) -> str:
    """``track / gpu``, prefixed by the sweep's name where it is not the track's (the default), marked ``cpu:
    plumbing only`` where the cells were graded on a CPU (every table and plot of the board carries it)."""
    where = f"{board['track']} / {board['gpu']}" + (" · cpu: plumbing only" if board.get("cpu") else "")
    return where if board.get("sweep") in (None, board["track"]) else f"sweep {board['sweep']}: {where}"


def sections(
    board: Dict[str, Any], terminal: bool = False
) -> List[Tuple[str, List[str], List[List[str]], Optional[str]]]:
    """A board's tables, each ``(kind, header, rows, note)``: the board (``compact`` in the terminal where the deck is
    large), KernelBench's metrics, the audit-flagged cells, the regrades and how the harnesses' setups differ from the
    built-in loop's; those without rows left out."""
    small = len(board["deck"]) <= MAX_PROBLEM_COLUMNS
    found = [
        ("board", *board_table(board, small, compact=terminal and not small), board_note(board)),
        ("kernelbench", *kernelbench_table(board), kernelbench_note(board)),
        ("flagged", *flagged_table(board), None),
        ("regrades", *regrade_table(board), None),
        ("setups", *setup_table(board), None),
    ]
    return [section for section in found if section[2]]


def setup_table(board: Dict[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """Where each harness's setup differs from the built-in loop's (:func:`kbsweep.reporting.report.setup_differences`)."""
    rows = [[d["harness"], d["setting"], d["builtin"], d["value"]] for d in board.get("setups") or []]
    return ["harness", "setting", "built-in loop", "this harness"], rows


NAME_COLUMNS = 3  # every table's first three (rank/model/harness, model/harness/level or problem): never wrapped
TITLES = {  # kind: (terminal, Markdown, HTML), {} the board's title
    "board": ("kbsweep leaderboard — {}", "## {}", "<h2>{}</h2>"),
    "kernelbench": (
        "KernelBench metrics — {}",
        "### KernelBench metrics (its verdict, fast_p, geomean speedups)",
        "<h3>KernelBench metrics</h3>",
    ),
    "flagged": (
        "audit-flagged — {}",
        "### Audit-flagged passes (not ranked)",
        "<h3>Audit-flagged passes (not ranked)</h3>",
    ),
    "regrades": ("regrades — {}", "### Regrades (`kbsweep regrade`)", "<h3>Regrades</h3>"),
    "setups": (
        "harness setups — {}",
        "### Harness setups (where each differs from the built-in loop)",
        "<h3>Harness setups</h3>",
    ),
}


def render_terminal(boards: List[Dict[str, Any]], width: Optional[int] = None) -> str:
    """The boards' tables within ``width`` columns (None: the terminal's where stdout is one, no limit where it is
    piped). No cell is cut or wrapped, so every number and name reads whole: headers wrap at their words, and a
    table wider than the limit even so is split into parts, each with the name columns (:func:`fit`)."""
    from rich.console import Console
    from rich.table import Table

    limit = width or terminal_width()
    buffer = io.StringIO()
    console = Console(file=buffer, width=limit or 80, force_terminal=False)
    if not boards:
        console.print("no finished cells in the tracking store")
    for board in boards:
        for kind, header, rows, note in sections(board, terminal=True):
            parts = fit(header, rows, limit)
            for n, (columns, widths) in enumerate(parts, 1):
                title = TITLES[kind][0].format(board_title(board)) + (
                    f" (part {n} of {len(parts)})" if len(parts) > 1 else ""
                )
                table = Table(title=title, caption=note if n == len(parts) else None)
                for i, column_width in zip(columns, widths):
                    table.add_column(header[i], justify="left" if i < NAME_COLUMNS else "right", width=column_width)
                for row in rows:
                    table.add_row(*(row[i] for i in columns))
                console.width = max(
                    limit or 0, table_width(widths)
                )  # never narrower than its columns: rich would cut them
                console.print(table)
    return buffer.getvalue()


def terminal_width() -> Optional[int]:
    """The terminal's columns where stdout is one; None where it is piped (a file or a pager wraps nothing)."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def table_width(widths: List[int]) -> int:
    """A rich table's width with these column widths: each column padded by a space either side, a border between
    and around them."""
    return sum(widths) + 3 * len(widths) + 1


def fit(header: List[str], rows: List[List[str]], limit: Optional[int]) -> List[Tuple[List[int], List[int]]]:
    """Parts of a table within ``limit`` columns (None: one part, at its natural width), each as (its column
    indexes, their widths). A column is at least its longest cell and its header's longest word wide; where those
    leave room, headers get it to stay on one line. Columns that fit no part with the :data:`NAME_COLUMNS` beside
    them go to the next part, which repeats those; a part wider than ``limit`` still is one whose name columns alone
    are."""
    from rich.cells import cell_len

    least = [
        max([max(map(cell_len, name.split()), default=0), *(cell_len(row[i]) for row in rows)])
        for i, name in enumerate(header)
    ]
    most = [max(least[i], cell_len(name)) for i, name in enumerate(header)]
    everything = list(range(len(header)))
    if limit is None or table_width(most) <= limit:
        return [(everything, most)]
    names = everything[:NAME_COLUMNS]
    parts = [list(names)]
    for i in everything[len(names) :]:
        if len(parts[-1]) > len(names) and table_width([least[j] for j in parts[-1] + [i]]) > limit:
            parts.append(list(names))
        parts[-1].append(i)
    laid = []
    for part in parts:
        widths = [least[i] for i in part]
        room = max(0, limit - table_width(widths))
        for n, i in enumerate(part):
            grown = min(room, most[i] - least[i])
            widths[n] += grown
            room -= grown
        laid.append((part, widths))
    return laid


def markdown_table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def render_markdown(boards: List[Dict[str, Any]]) -> str:
    parts = ["# kbsweep report", ""]
    for board in boards:
        for kind, header, rows, note in sections(board):
            parts += [TITLES[kind][1].format(board_title(board)), "", markdown_table(header, rows), ""] + (
                [f"_{note}._", ""] if note else []
            )
    return "\n".join(parts)


def html_table(header: List[str], rows: List[List[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(boards: List[Dict[str, Any]], plots: Dict[str, Dict[str, bytes]]) -> str:
    """One static page: the tables and every plot inlined as PNG."""
    parts = []
    for board in boards:
        for kind, header, rows, note in sections(board):
            parts.append(
                TITLES[kind][2].format(html.escape(board_title(board)))
                + html_table(header, rows)
                + (f"<p><em>{html.escape(note)}</em></p>" if note else "")
            )
            if kind == "board" and len(board["deck"]) > MAX_PROBLEM_COLUMNS:
                parts.append(f"<h3>Per problem (model × problem)</h3>{heatmap_html(board)}")
        for name, image in plots.get(board_key(board), {}).items():
            data = base64.b64encode(image).decode()
            img = f'<img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'
            parts.append(f"<figure>{img}<figcaption>{html.escape(name)}</figcaption></figure>")
    style = "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
    style += "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}figure{display:inline-block;margin:1em}"
    style += ".heatmap td.hm{width:12px;height:16px;padding:0}.heatmap th{font-size:9px;padding:1px 2px}"
    head = f"<meta charset='utf-8'><title>kbsweep report</title><style>{style}</style>"
    return f"<!doctype html><html><head>{head}</head><body><h1>kbsweep report</h1>{''.join(parts)}</body></html>"


def heatmap_html(board: Dict[str, Any]) -> str:
    """Model × problem: each model's best cell per problem, coloured (a valid pass green, darker the faster
    against the column's best; flagged orange; failed grey; never run blank), the figures in each cell's tooltip;
    columns in KernelBench's numeric order under their level."""
    best: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for c in board["cells"]:
        rank = (c["valid"], c["flagged"], c["score"] or 0.0)
        held = best.get((c["entrant"], c["problem"]))
        if held is None or rank > (held["valid"], held["flagged"], held["score"] or 0.0):
            best[(c["entrant"], c["problem"])] = c
    top = {
        p: max([(c["score"] or 0.0) for (m, q), c in best.items() if q == p and c["valid"]], default=0.0)
        for p in board["deck"]
    }
    level = {c["problem"]: c["level"] for c in board["cells"]}
    spans = [(name, len(list(group))) for name, group in itertools.groupby(board["deck"], key=lambda p: level[p])]
    head = "<tr><th></th>" + "".join(f"<th colspan='{n}'>{html.escape(name)}</th>" for name, n in spans) + "</tr>"
    head += (
        "<tr><th>model</th>"
        + "".join(f"<th title='{html.escape(p)}'>{html.escape(short_name(p))}</th>" for p in board["deck"])
        + "</tr>"
    )
    body = []
    for e in board["models"]:
        tds = []
        for p in board["deck"]:
            c = best.get((e["entrant"], p))
            if c is None:
                tds.append("<td class='hm'></td>")
                continue
            if c["valid"]:
                shade = 0.25 + 0.75 * ((c["score"] or 0.0) / top[p] if top[p] else 0.0)
                colour = f"rgba(0,128,0,{shade:.2f})"
            else:
                colour = "#f0a030" if c["flagged"] else "#cccccc"
            tip = f"{p}: {c['outcome']}, score {fmt(c['score'])}, speedup over eager {fmt(c['speedup_eager'])}, verdict {c['verdict']}"
            tds.append(f"<td class='hm' style='background:{colour}' title='{html.escape(tip)}'></td>")
        body.append(f"<tr><th>{html.escape(e['entrant'])}</th>{''.join(tds)}</tr>")
    return f"<table class='heatmap'><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"


def short_name(problem: str) -> str:
    """A heatmap column's label: a KernelBench problem's number, else its name."""
    name = problem.split("/")[-1]
    number = re.match(r"\d+", name)
    return number.group(0) if number else name


def board_key(board: Dict[str, Any]) -> str:
    prefix = "" if board.get("sweep") in (None, board["track"]) else f"{board['sweep']}_"
    return f"{prefix}{board['track']}_{board['gpu']}".replace("/", "_")


def board_figures(board: Dict[str, Any]) -> Dict[str, Any]:
    figures = {}
    for problem, series in board["shapes"].items():
        if any(series.values()):
            figures[f"roofline_{problem.split('/')[-1]}"] = roofline_figure(
                f"{problem} on {board['gpu']}", series, board["rooflines"][problem]
            )
    if not board["models"]:  # nothing scored: no capability to plot
        return figures
    figures["pareto_dollars"] = frontier_figure(
        f"capability per dollar — {board_title(board)}",
        "dollars spent on the board",
        {e["entrant"]: (e["usd"], e["deck_mean"]) for e in board["models"]},
    )
    figures["capability_vs_output_tokens"] = frontier_figure(
        f"capability vs output tokens — {board_title(board)}",
        "output tokens on the board",
        {e["entrant"]: (e["tokens_output"], e["deck_mean"]) for e in board["models"]},
    )
    return figures


def write_report(boards: List[Dict[str, Any]], folder: Path) -> Dict[str, Path]:
    """report.md, report.json, report.html and plots/<board>/<name>.png under ``folder``."""
    folder = Path(folder)
    (folder / "plots").mkdir(parents=True, exist_ok=True)
    plots: Dict[str, Dict[str, bytes]] = {}
    for board in boards:
        plots[board_key(board)] = {name: png(figure) for name, figure in board_figures(board).items()}
        (folder / "plots" / board_key(board)).mkdir(exist_ok=True)
        for name, data in plots[board_key(board)].items():
            (folder / "plots" / board_key(board) / f"{name}.png").write_bytes(data)
    paths = {"markdown": folder / "report.md", "json": folder / "report.json", "html": folder / "report.html"}
    paths["markdown"].write_text(render_markdown(boards))
    paths["json"].write_text(json.dumps({"boards": boards}, indent=1, default=str))
    paths["html"].write_text(render_html(boards, plots))
    return paths
