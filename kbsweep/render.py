"""The report's outputs: a rich terminal table, Markdown, JSON and one static HTML page with the plots embedded
(roofline per problem, capability against dollars and against output tokens with their Pareto frontiers)."""
from __future__ import annotations

import base64
import html
import io
import itertools
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from kbsweep.figures import frontier_figure, png, roofline_figure
from kbsweep.report import FAST_P, natural

TERMINAL_WIDTH = 120  # a large deck's board (compact) fits it
MAX_PROBLEM_COLUMNS = 12  # a larger deck shows per-level aggregates in the terminal, per-problem cells in report.html


def kernelbench_table(board: Dict[str, Any]) -> Tuple[List[str], List[List[str]]]:
    header = ["model", "level", "cells", "KB correct", "kbsweep pass", *[f"fast_{p:g}" for p in FAST_P], "geomean eager", "geomean compile"]
    rows = [[e["model"], e["level"], str(e["cells"]), str(e["correct"]), str(e["kbsweep_passed"]),
             *[fmt(e[f"fast_{p:g}"], ".2f") for p in FAST_P], fmt(e["geomean_eager"]), fmt(e["geomean_compile"])]
            for e in board.get("kernelbench") or []]
    return header, rows


def fmt(value: Optional[float], spec: str = ".3g") -> str:
    return "–" if value is None else format(value, spec)


def board_table(board: Dict[str, Any], per_problem: bool = True, compact: bool = False) -> Tuple[List[str], List[List[str]]]:
    """Header and rows of a board, shared by every renderer. A flagged best shows as ``DQ(score)``, counted 0.
    ``per_problem`` False (a deck over MAX_PROBLEM_COLUMNS): no column per problem but one row per model and level
    with the level's aggregates (kbsweep passes / cells, fast_1, fast_2, geomean speedup over eager), the model's
    own figures on its first row (report.html keeps the problems, as a heatmap). ``compact``: the terminal's
    columns only, within TERMINAL_WIDTH whatever the number of levels."""
    k = board["k"]
    deck = board["deck"] if per_problem else []
    levels = [] if per_problem else sorted({c["level"] for c in board["cells"]}, key=natural)
    header = ["rank", "model", *[f"{p.split('/')[-1]} mean" for p in deck]]
    header += ["level", "passed", "fast_1", "fast_2", "geomean"] if levels else []
    tail = ["deck mean ± CI95", "pass@1"] + [f"pass@{k}"] * (k > 1) + ["passed/cells", "flagged", "out tokens", "$", "$/pass", "out tok/pass"]
    keep = [i for i, name in enumerate(tail) if not compact or name in ("deck mean ± CI95", "pass@1", "$")]  # passes: per level
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
        values = ([spread, fmt(e["pass_at_1"], ".2f")] + [fmt(e["pass_at_k"], ".2f")] * (k > 1)
                  + [f"{e['passed']}/{e['cells']}", str(e["flagged_cells"]), fmt(e["tokens_output"], ".0f"), fmt(e["usd"], ".2f"),
                     fmt(e["usd_per_pass"], ".3f"), fmt(e["tokens_output_per_pass"], ".0f")])
        own = [values[i] for i in keep]
        if not levels:
            rows.append([str(e["rank"]), e["model"], *scores, *own])
        for n, level in enumerate(lv for lv in levels if lv in board["levels"].get(e["model"], {})):
            a = board["levels"][e["model"]][level]
            aggregates = [level, f"{a['passed']}/{a['cells']}", fmt(a["fast_1"], ".2f"), fmt(a["fast_2"], ".2f"), fmt(a["geomean"], ".2f")]
            rows.append(([str(e["rank"]), e["model"]] if n == 0 else ["", ""]) + aggregates + (own if n == 0 else [""] * len(own)))
    return header, rows


def flagged_table(board: Dict[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """Passes the audit did not clear: shown, never ranked."""
    rows = [
        [c["model"], c["problem"], str(c["repeat"]), str(c["verdict"]), fmt(c["score"]), c["run_id"]]
        for c in board["cells"]
        if c["flagged"]
    ]
    return ["model", "problem", "repeat", "verdict", "score (not ranked)", "run"], rows


MEANING = ("scores: the mean over repeats of each cell's valid score (a failure, a missing cell or a flagged pass "
           "counts 0; DQ(x): only a flagged pass, of score x); deck mean: over the deck's problems, with the 95% Student-t "
           "interval over the n repeats' deck means")


def regrade_table(board: Dict[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """The sweep's score of each regraded solution beside its regrade's (on its GPU), and their ratio."""
    rows = []
    for r in board.get("regrades") or []:
        ratio = r["score"] / r["old_score"] if r["score"] is not None and r["old_score"] else None
        rows.append([r["model"], r["problem"], str(r["repeat"]), f"{r['old_outcome']} {fmt(r['old_score'])} ({r['old_gpu']})",
                     f"{r['outcome']} {fmt(r['score'])} ({r['gpu']})", fmt(ratio)])
    return ["model", "problem", "repeat", "sweep: outcome score (GPU)", "regrade: outcome score (GPU)", "regrade / sweep"], rows


def board_title(board: Dict[str, Any]) -> str:
    """``track / gpu``, prefixed by the sweep's name where it is not the track's (the default)."""
    where = f"{board['track']} / {board['gpu']}"
    return where if board.get("sweep") in (None, board["track"]) else f"sweep {board['sweep']}: {where}"


def render_terminal(boards: List[Dict[str, Any]], width: int = 160) -> str:
    from rich.console import Console
    from rich.table import Table

    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=False)
    if not boards:
        console.print("no finished cells in the tracking store")
    for board in boards:
        small = len(board["deck"]) <= MAX_PROBLEM_COLUMNS
        tables = ((f"kbsweep leaderboard — {board_title(board)}", board_table(board, small, compact=not small), MEANING),
                  (f"KernelBench metrics — {board_title(board)}", kernelbench_table(board), None),
                  (f"audit-flagged — {board_title(board)}", flagged_table(board), None),
                  (f"regrades — {board_title(board)}", regrade_table(board), None))
        for title, (header, rows), caption in tables:
            if not rows:
                continue
            table = Table(title=title, caption=caption)
            for i, column in enumerate(header):  # names whole: the numeric columns wrap their headers instead
                longest = max([len(column), *(len(row[i]) for row in rows)]) if i < 2 else None
                table.add_column(column, justify="left" if i < 2 else "right", no_wrap=i < 2, min_width=longest)
            for row in rows:
                table.add_row(*row)
            console.print(table)
    return buffer.getvalue()


def markdown_table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def render_markdown(boards: List[Dict[str, Any]]) -> str:
    parts = ["# kbsweep report", ""]
    for board in boards:
        parts += [f"## {board_title(board)}", "", markdown_table(*board_table(board, len(board["deck"]) <= MAX_PROBLEM_COLUMNS)), "",
                  f"_{MEANING}._", ""]
        header, rows = kernelbench_table(board)
        if rows:
            parts += ["### KernelBench metrics (its verdict, fast_p, geomean speedups)", "", markdown_table(header, rows), ""]
        header, rows = flagged_table(board)
        if rows:
            parts += ["### Audit-flagged passes (not ranked)", "", markdown_table(header, rows), ""]
        header, rows = regrade_table(board)
        if rows:
            parts += ["### Regrades (`kbsweep regrade`)", "", markdown_table(header, rows), ""]
    return "\n".join(parts)


def html_table(header: List[str], rows: List[List[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(boards: List[Dict[str, Any]], plots: Dict[str, Dict[str, bytes]]) -> str:
    """One static page: the tables and every plot inlined as PNG."""
    parts = []
    for board in boards:
        small = len(board["deck"]) <= MAX_PROBLEM_COLUMNS
        parts.append(f"<h2>{html.escape(board_title(board))}</h2>{html_table(*board_table(board, small))}<p><em>{html.escape(MEANING)}</em></p>")
        if not small:
            parts.append(f"<h3>Per problem (model × problem)</h3>{heatmap_html(board)}")
        header, rows = kernelbench_table(board)
        if rows:
            parts.append(f"<h3>KernelBench metrics</h3>{html_table(header, rows)}")
        header, rows = flagged_table(board)
        if rows:
            parts.append(f"<h3>Audit-flagged passes (not ranked)</h3>{html_table(header, rows)}")
        header, rows = regrade_table(board)
        if rows:
            parts.append(f"<h3>Regrades</h3>{html_table(header, rows)}")
        for name, image in plots.get(board_key(board), {}).items():
            data = base64.b64encode(image).decode()
            parts.append(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{data}"><figcaption>{html.escape(name)}</figcaption></figure>')
    style = "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}figure{display:inline-block;margin:1em}"
    style += ".heatmap td.hm{width:12px;height:16px;padding:0}.heatmap th{font-size:9px;padding:1px 2px}"
    return f"<!doctype html><html><head><meta charset='utf-8'><title>kbsweep report</title><style>{style}</style></head><body><h1>kbsweep report</h1>{''.join(parts)}</body></html>"


def heatmap_html(board: Dict[str, Any]) -> str:
    """Model × problem: each model's best cell per problem, coloured (a valid pass green, darker the faster
    against the column's best; flagged orange; failed grey; never run blank), the figures in each cell's tooltip;
    columns in KernelBench's numeric order under their level."""
    best: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for c in board["cells"]:
        rank = (c["valid"], c["flagged"], c["score"] or 0.0)
        held = best.get((c["model"], c["problem"]))
        if held is None or rank > (held["valid"], held["flagged"], held["score"] or 0.0):
            best[(c["model"], c["problem"])] = c
    top = {p: max([(c["score"] or 0.0) for (m, q), c in best.items() if q == p and c["valid"]], default=0.0) for p in board["deck"]}
    level = {c["problem"]: c["level"] for c in board["cells"]}
    spans = [(name, len(list(group))) for name, group in itertools.groupby(board["deck"], key=lambda p: level[p])]
    head = "<tr><th></th>" + "".join(f"<th colspan='{n}'>{html.escape(name)}</th>" for name, n in spans) + "</tr>"
    head += "<tr><th>model</th>" + "".join(f"<th title='{html.escape(p)}'>{html.escape(short_name(p))}</th>" for p in board["deck"]) + "</tr>"
    body = []
    for e in board["models"]:
        tds = []
        for p in board["deck"]:
            c = best.get((e["model"], p))
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
        body.append(f"<tr><th>{html.escape(e['model'])}</th>{''.join(tds)}</tr>")
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
            figures[f"roofline_{problem.split('/')[-1]}"] = roofline_figure(f"{problem} on {board['gpu']}", series, board["rooflines"][problem])
    capability = {e["model"]: e["deck_mean"] for e in board["models"]}
    figures["pareto_dollars"] = frontier_figure(f"capability per dollar — {board_title(board)}", "dollars spent on the board", {e["model"]: (e["usd"], capability[e["model"]]) for e in board["models"]})
    figures["capability_vs_output_tokens"] = frontier_figure(f"capability vs output tokens — {board_title(board)}", "output tokens on the board", {e["model"]: (e["tokens_output"], capability[e["model"]]) for e in board["models"]})
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
