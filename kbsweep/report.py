"""The report stage: boards per (track, GPU) from the tracking store, and the plots that explain them.

A board per sweep and (track, GPU) ranks models by the mean over the full deck and over repeats of their
valid scores (a failure, a missing cell or an audit-flagged pass counts 0). Only a pass with a clean verdict (or a human's
override_clean) is valid; flagged passes are listed with their verdict but never ranked. Repeats give a
mean with a 95% confidence interval (Student t over per-repeat deck scores) and pass@1 / pass@k
(the unbiased estimator over the repeats). Output: a rich terminal table, Markdown, JSON and one static
HTML page with the plots embedded (roofline per problem, capability against dollars and against output
tokens with their Pareto frontiers).
"""
from __future__ import annotations

import base64
import html
import io
import itertools
import json
import math
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from kbsweep.outcomes import Outcome

VALID_VERDICTS = ("clean", "override_clean")
FAST_P = (0.0, 1.0, 1.5, 2.0)  # KernelBench's fast_p thresholds
LEVEL_FAST_P = (1.0, 2.0)  # the board's per-level columns
TERMINAL_WIDTH = 120  # a large deck's board (compact) fits it
MAX_PROBLEM_COLUMNS = 12  # a larger deck shows per-level aggregates in the terminal, per-problem cells in report.html
Point = Tuple[float, float]


def is_valid_pass(row: Dict[str, Any]) -> bool:
    return row.get("outcome") == Outcome.PASS.value and row.get("verdict") in VALID_VERDICTS


def is_flagged(row: Dict[str, Any]) -> bool:
    """A result the audit did not clear: shown on the board, never ranked."""
    audited = (Outcome.DISQUALIFIED.value, Outcome.NEEDS_HUMAN.value)
    return row.get("outcome") in audited or (row.get("outcome") == Outcome.PASS.value and not is_valid_pass(row))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c passes (Chen et al. 2021); k is capped at n."""
    k = min(k, n)
    if n == 0:
        return 0.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_ci95(values: List[float]) -> Tuple[float, Optional[float]]:
    """Mean and the half-width of its 95% Student-t interval (None for fewer than two values)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    from scipy.stats import t

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, float(t.ppf(0.975, len(values) - 1)) * sd / math.sqrt(len(values))


def pareto(points: Dict[str, Point]) -> List[str]:
    """Names on the frontier: no other point costs as little (x) and scores at least as much (y)."""
    frontier, best = [], -math.inf
    for name, (_, y) in sorted(points.items(), key=lambda item: (item[1][0], -item[1][1])):
        if y > best:
            frontier.append(name)
            best = y
    return frontier


def shape_label(shape: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in shape.items()) if isinstance(shape, dict) else str(shape)


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


def shape_points(metrics: Dict[str, Any], params: Dict[str, str]) -> List[Dict[str, Any]]:
    """Achieved TFLOP/s and GB/s per shape of one run (shapes with both numbers only)."""
    points = []
    for i in range(1000):
        tflops, gbps = metrics.get(f"shape{i}.tflops"), metrics.get(f"shape{i}.gbps")
        if f"shape{i}.ms" not in metrics:
            break
        if tflops and gbps:
            points.append({"shape": params.get(f"shape{i}", str(i)), "tflops": tflops, "gbps": gbps, "intensity": tflops * 1e3 / gbps})
    return points


def model_entry(model: str, rows: List[Dict[str, Any]], deck: List[str], k: int) -> Dict[str, Any]:
    """One model's line on a board; ``k`` for pass@k is the board's largest number of tries of one problem."""
    best: Dict[str, float] = {}
    best_run: Dict[str, str] = {}
    flagged: Dict[str, Dict[str, Any]] = {}
    per_repeat: Dict[str, Dict[str, float]] = defaultdict(dict)
    tries: Dict[str, List[bool]] = defaultdict(list)
    for row in rows:
        problem, score = row.get("problem"), row.get("score") or 0.0
        valid = is_valid_pass(row)
        tries[problem].append(valid)
        if valid:
            per_repeat[row.get("repeat")][problem] = score
            if problem not in best or score > best[problem]:
                best[problem], best_run[problem] = score, row["run_id"]
        elif is_flagged(row) and score >= (flagged.get(problem, {}).get("score") or -1.0):
            flagged[problem] = {"score": row.get("score"), "verdict": row.get("verdict"), "run_id": row["run_id"]}
    repeats = sorted({row.get("repeat") for row in rows}, key=str)
    mean, ci = mean_ci95([sum(per_repeat[r].get(p, 0.0) for p in deck) / len(deck) for r in repeats])
    means = {p: sum(per_repeat[r].get(p, 0.0) for r in repeats) / len(repeats) for p in deck}
    passed = sum(1 for row in rows if is_valid_pass(row))
    usd = sum(row.get("cost_usd", 0.0) for row in rows)
    out_tokens = sum(row.get("tokens_output", 0.0) for row in rows)
    return {
        "model": model,
        "deck_mean": mean,  # over repeats of their deck means: the mean of ``means``
        "deck_ci95": ci,
        "means": means,
        "best": best,
        "best_run": best_run,
        "flagged": {p: f for p, f in flagged.items() if p not in best},
        "cells": len(rows),
        "passed": passed,
        "flagged_cells": sum(1 for row in rows if is_flagged(row)),
        "repeats": len(repeats),
        "pass_at_1": sum(pass_at_k(len(tries[p]), sum(tries[p]), 1) for p in deck) / len(deck),
        "pass_at_k": sum(pass_at_k(len(tries[p]), sum(tries[p]), k) for p in deck) / len(deck),
        "usd": usd,
        "tokens_input": sum(row.get("tokens_input", 0.0) for row in rows),
        "tokens_output": out_tokens,
        "usd_per_pass": usd / passed if passed else None,
        "tokens_output_per_pass": out_tokens / passed if passed else None,
    }


def entrant(row: Dict[str, Any]) -> str:
    """Who a board ranks: the model, as ``model@harness`` when a harness other than the built-in loop drove it."""
    harness = row.get("harness")
    return row.get("model") if harness in (None, "builtin") else f"{row.get('model')}@{harness}"


def build_boards(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Boards per (track, GPU) from ``tracking.runs_frame`` rows (the latest finished run per cell counts)."""
    from kbsweep.tracking import latest_per_cell

    sweeps: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for row in rows:
        sweeps[row["experiment"]].append(row)
    grouped: Dict[Tuple[str, str, str], List[Dict[str, Any]]] = defaultdict(list)
    for sweep, sweep_rows in sweeps.items():  # the latest record of a cell within its sweep: each sweep its board
        for row in latest_per_cell(sweep_rows):
            grouped[(sweep, row.get("track"), row.get("gpu"))].append(row)
    boards = []
    for (sweep, track, gpu), board_rows in sorted(grouped.items(), key=lambda item: tuple(map(str, item[0]))):
        levels = {row.get("problem"): level_of(row) for row in board_rows}
        deck = sorted(levels, key=lambda p: (natural(levels[p]), natural(p)))  # by level, then KernelBench's numbers
        by_model: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
        for row in board_rows:
            by_model[entrant(row)].append(row)
        k = max(Counter((entrant(row), row.get("problem")) for row in board_rows).values())
        models = sorted((model_entry(m, r, deck, k) for m, r in by_model.items()), key=lambda e: (-e["deck_mean"], -e["passed"], e["model"]))
        for rank, entry in enumerate(models, 1):
            entry["rank"] = rank
        shapes: Dict[str, Dict[str, List[Dict[str, Any]]]] = {problem: defaultdict(list) for problem in deck}
        for row in board_rows:  # every valid run's shapes: each repeat's points
            if is_valid_pass(row):
                shapes[row.get("problem")][entrant(row)] += shape_points(row, row["params"])
        rooflines = {row.get("problem"): roofline_of(row["params"]) for row in board_rows}
        cells = [
            {
                "model": entrant(row), "problem": row.get("problem"), "repeat": row.get("repeat"), "outcome": row.get("outcome"),
                "verdict": row.get("verdict"), "valid": is_valid_pass(row), "flagged": is_flagged(row), "score": row.get("score"), "usd": row.get("cost_usd"),
                "tokens_output": row.get("tokens_output"), "run_id": row["run_id"], "experiment": row["experiment"],
                "level": level_of(row), "speedup_eager": row.get("speedup_eager"),
            }
            for row in sorted(board_rows, key=lambda r: (str(entrant(r)), str(r.get("problem")), str(r.get("repeat"))))
        ]
        experiments = sorted({row["experiment"] for row in board_rows})
        boards.append(
            {"sweep": sweep, "track": track, "gpu": gpu, "deck": deck, "k": k, "models": models, "cells": cells, "shapes": shapes, "rooflines": rooflines,
             "experiments": experiments, "kernelbench": kernelbench_metrics(board_rows)}
        )
        boards[-1]["levels"] = level_aggregates(boards[-1])
    return boards


def natural(name: Optional[str]) -> List[Any]:
    """Sort key: digit runs as numbers (kernelbench/2_x before kernelbench/10_y, as KernelBench numbers them)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(name))]


def level_aggregates(board: Dict[str, Any]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """Per model and level (the problems folder's name): cells, valid passes, fast_1 and fast_2 (the share of
    the level's cells with a valid pass faster than eager by more than 1x, 2x) and the geometric mean speedup
    over eager of the valid passes; kbsweep's verdict throughout (the KernelBench metrics table has KernelBench's)."""
    from kbsweep.score import geomean

    out: Dict[str, Dict[str, Dict[str, Any]]] = defaultdict(dict)
    for (model, level), cells in sorted(group_by(board["cells"], lambda c: (c["model"], c["level"])).items()):
        speedups = [c["speedup_eager"] or 0.0 for c in cells if c["valid"]]
        out[model][level] = {"cells": len(cells), "passed": len(speedups),
                             **{f"fast_{p:g}": sum(1 for x in speedups if x > p) / len(cells) for p in LEVEL_FAST_P},
                             "geomean": geomean([x for x in speedups if x > 0]) if any(x > 0 for x in speedups) else None}
    return dict(out)


def group_by(items: List[Dict[str, Any]], key) -> Dict[Any, List[Dict[str, Any]]]:
    groups: Dict[Any, List[Dict[str, Any]]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return groups


def level_of(row: Dict[str, Any]) -> str:
    """A KernelBench cell's level: the name of the folder its problems came from (level1, level2, ...)."""
    return Path(str((row.get("params") or {}).get("track.problems_dir", "?"))).name


def kernelbench_metrics(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """KernelBench's metrics per model and level, its verdict deciding correctness: fast_p (the share of all cells
    correct and faster than eager by more than p; n counts every cell) and the geometric mean speedup over eager
    and torch.compile of the correct, timed cells. A cell KernelBench calls correct that kbsweep's checks failed is
    timed for these metrics alone (``kernelbench_speedup_*``; kbsweep's score stays failed)."""
    from kbsweep.score import geomean

    groups: Dict[Tuple[str, str], List[Dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.get("verdict.kernelbench") is not None:
            groups[(entrant(row), level_of(row))].append(row)
    table = []
    for (model, level), cells in sorted(groups.items()):
        correct = [r for r in cells if r["verdict.kernelbench"] == "correct"]
        entry = {"model": model, "level": level, "cells": len(cells), "correct": len(correct),
                 "kbsweep_passed": sum(1 for r in cells if r.get("verdict.kbsweep") == Outcome.PASS.value)}
        for p in FAST_P:
            entry[f"fast_{p:g}"] = sum(1 for r in correct if p == 0.0 or (kernelbench_speedup(r, "eager") or 0.0) > p) / len(cells)
        for name in ("eager", "compile"):
            speedups = [kernelbench_speedup(r, name) for r in correct if kernelbench_speedup(r, name)]
            entry[f"geomean_{name}"] = geomean(speedups) if speedups else None
        table.append(entry)
    return table


def kernelbench_speedup(row: Dict[str, Any], name: str) -> Optional[float]:
    """A cell's speedup for KernelBench's metrics (runs logged before ``kernelbench_speedup_*`` existed: kbsweep's)."""
    return row.get(f"kernelbench_speedup_{name}", row.get(f"speedup_{name}"))


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


def attach_regrades(boards: List[Dict[str, Any]], regrades: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each board's ``regrades``: per run of the board and GPU, the latest finished ``kbsweep regrade`` of its
    solution (``tracking.runs_frame(kind="regrade")`` rows), beside the run's own outcome and score."""
    latest: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for row in regrades:
        key = (row.get("kbsweep.regrade_of"), row.get("gpu"))
        if row.get("status") == "FINISHED" and (key not in latest or row["start_time"] > latest[key]["start_time"]):
            latest[key] = row
    for board in boards:
        runs = {c["run_id"]: c for c in board["cells"]}
        board["regrades"] = [
            {"model": runs[of]["model"], "problem": runs[of]["problem"], "repeat": runs[of]["repeat"], "run_id": of,
             "old_gpu": board["gpu"], "old_outcome": runs[of]["outcome"], "old_score": runs[of]["score"],
             "gpu": gpu, "outcome": row.get("outcome"), "score": row.get("score"), "regrade_run_id": row["run_id"]}
            for (of, gpu), row in sorted(latest.items(), key=lambda item: tuple(map(str, item[0]))) if of in runs
        ]
    return boards


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
        for name, png in plots.get(board_key(board), {}).items():
            data = base64.b64encode(png).decode()
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


def new_figure(title: str, panels: int = 1):
    from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas

    figure = Figure(figsize=(5.5 * panels, 4.2))
    axes = figure.subplots(1, panels, squeeze=False)[0]
    figure.subplots_adjust(left=0.15, right=0.96, bottom=0.12, top=0.9, wspace=0.35)  # fixed margins: a layout engine costs more than the plot
    figure.suptitle(title)
    for ax in axes:  # past 10^4 a linear axis counts in powers of ten: six-digit tick labels (dollars, tokens) ran together
        ax.ticklabel_format(style="sci", scilimits=(-3, 4))
    return figure, axes


def roofline_figure(title: str, series: Dict[str, List[Dict[str, Any]]], roofline: Dict[str, Any]):
    """Achieved TFLOP/s against arithmetic intensity, per shape, under the GPU's memory and compute roofs."""
    import numpy as np

    figure, (ax,) = new_figure(title)
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
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.legend(fontsize=7)
    return figure


def frontier_figure(title: str, xlabel: str, points: Dict[str, Point]):
    """Capability against a cost, one point per model, with the Pareto frontier drawn through."""
    figure, (ax,) = new_figure(title)
    for name, (x, y) in points.items():
        ax.scatter([x], [y], zorder=3)
        ax.annotate(name, (x, y), fontsize=8)
    front = [points[name] for name in pareto(points)]
    ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="tab:red", label="Pareto frontier")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("deck mean (failures as 0)")
    ax.legend(fontsize=7)
    return figure


def progress_figure(title: str, steps: List[Dict[str, Any]]):
    """The agent loop's best score so far against turn, tokens and dollars."""
    figure, axes = new_figure(title, panels=3)
    scored = [s for s in steps if s.get("best_score") is not None]
    for ax, key, label in zip(axes, ("turn", "tokens", "usd"), ("turn", "tokens", "dollars")):
        ax.step([s[key] for s in scored], [s["best_score"] for s in scored], where="post", marker="o")
        ax.set_xlabel(label)
        ax.set_ylabel("best score so far")
    return figure


def board_figures(board: Dict[str, Any]) -> Dict[str, Any]:
    figures = {}
    for problem, series in board["shapes"].items():
        if any(series.values()):
            figures[f"roofline_{problem.split('/')[-1]}"] = roofline_figure(f"{problem} on {board['gpu']}", series, board["rooflines"][problem])
    capability = {e["model"]: e["deck_mean"] for e in board["models"]}
    figures["pareto_dollars"] = frontier_figure(f"capability per dollar — {board_title(board)}", "dollars spent on the board", {e["model"]: (e["usd"], capability[e["model"]]) for e in board["models"]})
    figures["capability_vs_output_tokens"] = frontier_figure(f"capability vs output tokens — {board_title(board)}", "output tokens on the board", {e["model"]: (e["tokens_output"], capability[e["model"]]) for e in board["models"]})
    return figures


def cell_figures(result: Dict[str, Any], params: Dict[str, str]) -> Dict[str, Any]:
    """Plots logged with a cell run: its loop progress and its shapes on the roofline."""
    figures = {}
    title = str(result.get("cell", ""))
    if any(s.get("best_score") is not None for s in result.get("steps") or []):
        figures["progress"] = progress_figure(title, result["steps"])
    points = [
        {"shape": shape_label(s.get("shape")), "tflops": s["tflops"], "gbps": s["gbps"], "intensity": s["tflops"] * 1e3 / s["gbps"]}
        for s in result.get("shapes") or []
        if s.get("tflops") and s.get("gbps")
    ]
    roofline = roofline_of(params)
    if points and roofline["peaks_tflops"]:
        figures["roofline"] = roofline_figure(title, {title.split(" · ")[0]: points}, roofline)
    return figures


def png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")  # long tick labels widen the image, never clipped
    return buffer.getvalue()


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
