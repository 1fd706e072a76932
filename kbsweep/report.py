"""The report stage: a leaderboard per (track, GPU) from the tracking store."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List

from kbsweep.outcomes import Verdict


def leaderboard(rows: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """Per (track, gpu): per model, best valid score per problem, passes, full-deck mean (failures as 0).

    A cell counts only when it finished and its audit verdict is clean (or a human overrode it).
    """
    boards: Dict[str, Dict[str, Dict[str, Any]]] = defaultdict(dict)
    problems: Dict[str, set] = defaultdict(set)
    for row in rows:
        if row.get("status") != "FINISHED":
            continue
        board = f"{row.get('track')} / {row.get('gpu')}"
        problems[board].add(row.get("problem"))
        entry = boards[board].setdefault(
            row.get("model"), {"model": row.get("model"), "best": {}, "cells": 0, "passed": 0, "usd": 0.0, "tokens": 0.0, "flagged": 0}
        )
        entry["cells"] += 1
        entry["usd"] += row.get("cost_usd", 0.0)
        entry["tokens"] += row.get("tokens_input", 0.0) + row.get("tokens_output", 0.0)
        valid = row.get("verdict") in (Verdict.CLEAN.value, "override_clean")
        if row.get("outcome") == "pass" and not valid:
            entry["flagged"] += 1
        if row.get("outcome") == "pass" and valid:
            entry["passed"] += 1
            score = row.get("score")
            if score is not None:
                entry["best"][row["problem"]] = max(score, entry["best"].get(row["problem"], 0.0))
    out: Dict[str, List[Dict[str, Any]]] = {}
    for board, models in boards.items():
        deck = sorted(problems[board])
        ranked = []
        for entry in models.values():
            entry["deck_mean"] = sum(entry["best"].get(p, 0.0) for p in deck) / len(deck)
            entry["problems"] = deck
            ranked.append(entry)
        out[board] = sorted(ranked, key=lambda e: -e["deck_mean"])
    return out


def render_terminal(boards: Dict[str, List[Dict[str, Any]]]) -> str:
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    buffer = StringIO()
    console = Console(file=buffer, width=140, force_terminal=False)
    if not boards:
        console.print("no finished cells in the tracking store")
    for board, entries in sorted(boards.items()):
        deck = entries[0]["problems"] if entries else []
        table = Table(title=f"kbsweep leaderboard — {board}")
        table.add_column("rank")
        table.add_column("model")
        for problem in deck:
            table.add_column(problem.split("/")[-1], justify="right")
        for column in ("deck mean", "passed/cells", "flagged", "tokens", "$"):
            table.add_column(column, justify="right")
        for rank, entry in enumerate(entries, 1):
            cells = [f"{entry['best'][p]:.3g}" if p in entry["best"] else "0" for p in deck]
            table.add_row(
                str(rank), entry["model"], *cells, f"{entry['deck_mean']:.3g}", f"{entry['passed']}/{entry['cells']}",
                str(entry["flagged"]), f"{entry['tokens']:.0f}", f"{entry['usd']:.2f}",
            )
        console.print(table)
    return buffer.getvalue()
