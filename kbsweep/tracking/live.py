"""Live progress of running cells, read from the transcripts they append to (cells never write to MLflow).

A thread of the orchestrator reads each running cell's new ``transcript.jsonl`` lines every ``interval_s``: per
model turn it logs ``live.tokens`` and ``live.usd`` (step = turn) to the cell's run, per ``step`` event (a graded
check) ``live.best_score``, so the MLflow UI's charts move while the cell runs. When a cell ends its transcript is
read to the end before it is dropped, and the rest goes in the request of the cell's final metrics (the ``loop.*``
metrics from ``result.json``), so the live series is whole whatever the polls' timing (a series that depended on it
would differ between two runs of one cell). On a terminal the sweep's bar shows a table of the running cells (turn,
tokens, dollars, best check so far); elsewhere each turn is one plain line.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

LogMetrics = Callable[[str, List[tuple]], None]  # (run id, [(key, value, step)])


@dataclass
class Running:
    label: str
    run_id: Optional[str]
    transcript: Path
    started: float = field(default_factory=time.monotonic)
    offset: int = 0
    turn: int = 0
    tokens: int = 0
    usd: float = 0.0
    best: Optional[float] = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # the watch thread and finish() read one cell

    def read(self) -> List[Dict[str, Any]]:
        """The complete lines appended since the last read (a line being written waits for the next)."""
        try:
            with self.transcript.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def update(self, events: List[Dict[str, Any]]) -> List[tuple]:
        """Fold ``events`` into the totals; returns the metrics they mean."""
        metrics = []
        for event in events:
            if event["type"] == "assistant":
                usage = event.get("usage") or {}
                self.turn += 1
                self.tokens += int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
                self.usd += float(event.get("cost_usd") or 0.0)
                metrics += [("live.tokens", self.tokens, self.turn), ("live.usd", self.usd, self.turn)]
            elif event["type"] == "step" and event.get("best_score") is not None:
                self.best = event["best_score"]
                metrics.append(("live.best_score", self.best, event["turn"]))
        return metrics

    def line(self) -> str:
        best = "none yet" if self.best is None else f"{self.best:.4g}"
        return f"{self.label}: turn {self.turn}, {self.tokens:,} tokens, ${self.usd:.2f}, best check {best}"


class LiveCells:
    """The running cells; :meth:`poll` (from its own thread while entered) logs their new metrics."""

    def __init__(self, log: LogMetrics, say: Optional[Callable[[str], None]] = None, interval_s: float = 2.0):
        self.log, self.say, self.interval_s = log, say, interval_s
        self.cells: Dict[str, Running] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.watch, name="kbsweep-live", daemon=True)

    def add(self, key: str, label: str, run_id: Optional[str], transcript: Path) -> None:
        with self.lock:
            self.cells[key] = Running(label, run_id, transcript)

    def finish(self, key: str) -> List[tuple]:
        """Stop reading the ended cell's transcript; returns the metrics it holds beyond the last poll, for the
        caller to log with the cell's final ones (one request where two cost twice the store's work)."""
        with self.lock:
            cell = self.cells.pop(key, None)
        return self.catch_up(cell, log=False) if cell is not None else []

    def poll(self) -> None:
        with self.lock:
            running = list(self.cells.values())
        for cell in running:
            self.catch_up(cell)

    def catch_up(self, cell: Running, log: bool = True) -> List[tuple]:
        """Fold the cell's new transcript lines in; logs their metrics (``log``) and returns them."""
        with cell.lock:
            metrics = cell.update(cell.read())
        if metrics and cell.run_id and log:
            self.log(cell.run_id, metrics)
        if metrics and self.say:
            self.say(cell.line())
        return metrics

    def watch(self) -> None:
        while not self.stopped.wait(self.interval_s):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - live metrics must never stop a sweep; the final ones still come
                if self.say:
                    self.say(f"live progress: {exc}")

    def __enter__(self) -> "LiveCells":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stopped.set()
        self.thread.join()

    def table(self):
        """The running cells as a rich table."""
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for column in ("running cell", "turn", "tokens", "$", "best check", "time (s)"):
            table.add_column(column, justify="left" if column == "running cell" else "right")
        with self.lock:
            running = list(self.cells.values())
        for cell in running:
            best = "-" if cell.best is None else f"{cell.best:.4g}"
            table.add_row(
                cell.label,
                str(cell.turn),
                f"{cell.tokens:,}",
                f"{cell.usd:.2f}",
                best,
                f"{time.monotonic() - cell.started:.0f}",
            )
        return table
