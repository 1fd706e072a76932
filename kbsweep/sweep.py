"""The orchestrator: a sweep's cells → resume filter → launcher → tracking, with live progress."""
from __future__ import annotations

import json
import shutil
import sys
from typing import Any, Dict, List

from kbsweep.cell import RESULT_FILE
from kbsweep.launch import make_launcher
from kbsweep.matrix import Cell, cell_dir
from kbsweep.outcomes import Outcome
from kbsweep.tracking import Tracker


class Progress:
    """A live line: cells done / running / failed and dollars spent (rich when on a terminal)."""

    def __init__(self, total: int):
        self.total, self.done, self.running, self.failed, self.usd = total, 0, 0, 0, 0.0

    def line(self) -> str:
        return (
            f"[kbsweep] {self.done}/{self.total} done, {self.running} running, "
            f"{self.failed} failed, ${self.usd:.2f} spent"
        )

    def show(self, note: str = "") -> None:
        print(f"{self.line()}{'  ' + note if note else ''}", file=sys.stderr, flush=True)


def journal(cell: Cell) -> Dict[str, Any] | None:
    path = cell_dir(cell) / RESULT_FILE
    return json.loads(path.read_text()) if path.exists() else None


def run_sweep(cells: List[Cell], tracking: Dict[str, Any], launcher: Dict[str, Any], force: bool) -> List[Dict[str, Any]]:
    """Run every cell not already finished; log each result as it comes back. Returns the new results."""
    if not cells:
        return []
    tracker = Tracker(tracking["uri"], tracking["artifact_root"], cells[0].sweep)
    stale = tracker.close_stale()
    finished = {} if force else tracker.finished_keys()
    todo, replay = [], []
    for cell in cells:
        if cell.key in finished:
            continue
        recorded = journal(cell)
        if force or (recorded and Outcome(recorded["outcome"]).is_infra):
            shutil.rmtree(cell_dir(cell), ignore_errors=True)
            recorded = None
        (replay if recorded else todo).append(cell)
    progress = Progress(len(todo) + len(replay))
    print(
        f"[kbsweep] sweep '{cells[0].sweep}': {len(cells)} cells, {len(cells) - len(todo) - len(replay)} already "
        f"finished, {len(replay)} to log from disk, {len(todo)} to run"
        + (f" ({stale} stale runs closed)" if stale else ""),
        file=sys.stderr,
    )
    tracker.start_sweep({"launcher": launcher["kind"], "force": str(force)}, len(cells))
    run_ids: Dict[str, str] = {}
    results: List[Dict[str, Any]] = []

    def on_start(cell: Cell) -> None:
        run_ids[cell.key] = tracker.start_cell(cell)
        progress.running += 1
        progress.show(f"started {cell.label}")

    def on_done(cell: Cell, result: Dict[str, Any]) -> None:
        tracker.finish_cell(run_ids.pop(cell.key), result)
        progress.running -= 1
        progress.done += 1
        progress.usd += result.get("cost_usd") or 0.0
        if Outcome(result["outcome"]).is_infra:
            progress.failed += 1
        results.append(result)
        score = result.get("score")
        progress.show(f"{cell.label}: {result['outcome']}" + (f" score={score:.4g}" if score is not None else ""))

    status = "FAILED"
    try:
        for cell in replay:
            on_start(cell)
            on_done(cell, journal(cell))
        make_launcher(launcher).run(todo, on_start, on_done)
        status = "FINISHED"
    finally:
        tracker.end_sweep(status if not progress.failed else "FAILED")
    return results
