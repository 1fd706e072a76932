"""The orchestrator's tracking runs beside its launcher: logging a finished cell must not hold the loop that hands
free workers their next cells, and what is handed over is still logged, in order, before the sweep returns or
stops."""

from __future__ import annotations

import threading
import time
from typing import List

import pytest

from kbsweep.launch import sweep
from kbsweep.launch.launchers import Launcher
from kbsweep.launch.sweep import InOrder
from kbsweep.tracking.mlflow_store import runs_frame
from kbsweep.tracking.tracker import Tracker
from tests.test_tracking import make_cell, write_result

SLOW_S = 0.6  # one cell's logging, made slow


@pytest.mark.fast
def test_calls_run_in_order_on_another_thread():
    ran: List[tuple] = []
    with InOrder() as calls:
        for i in range(20):
            calls.submit(lambda i: (time.sleep(0.001 * (i % 3)), ran.append((i, threading.current_thread().name))), i)
    assert [i for i, _ in ran] == list(range(20))
    assert {name for _, name in ran} != {threading.current_thread().name} and len({name for _, name in ran}) == 1


@pytest.mark.fast
def test_an_error_reaches_the_caller_at_its_next_submit_or_at_the_end():
    ran: List[int] = []

    def fail(after_s: float) -> None:
        time.sleep(after_s)
        raise ValueError("tracking broke")

    with pytest.raises(ValueError, match="tracking broke"):  # at the block's end, after the calls given
        with InOrder() as calls:
            calls.submit(fail, 0.3)
            calls.submit(ran.append, 1)
    assert ran == [1]

    with pytest.raises(ValueError, match="tracking broke"):  # at the next submit, once the failed call has run
        with InOrder() as calls:
            calls.submit(fail, 0.0)
            time.sleep(0.3)
            calls.submit(ran.append, 2)
    assert ran == [1]


@pytest.mark.fast
def test_a_stopping_block_still_runs_what_was_given_and_keeps_its_own_error():
    ran: List[int] = []
    with pytest.raises(KeyboardInterrupt):
        with InOrder() as calls:
            calls.submit(lambda: (time.sleep(0.3), ran.append(1)))
            calls.submit(ran.append, 2)
            raise KeyboardInterrupt
    assert ran == [1, 2]


class TimedLauncher(Launcher):
    """Runs each cell at once and records how long the sweep's callbacks held it."""

    def __init__(self):
        super().__init__({"kind": "timed"})
        self.held_s: List[float] = []

    def run(self, cells, on_start, on_done):
        for cell in cells:
            started = time.monotonic()
            on_start(cell)
            on_done(cell, write_result(cell))
            self.held_s.append(time.monotonic() - started)


def test_slow_logging_does_not_hold_the_launcher_and_every_cell_is_logged(store, monkeypatch):
    outputs, uri = store
    cells = [make_cell(outputs, repeat=r) for r in range(3)]
    launcher = TimedLauncher()
    monkeypatch.setattr(sweep, "make_launcher", lambda _conf: launcher)
    finish = Tracker.finish_cell
    monkeypatch.setattr(
        Tracker,
        "finish_cell",
        lambda self, run_id, result, *live: (time.sleep(SLOW_S), finish(self, run_id, result, *live))[1],
    )

    started = time.monotonic()
    assert (
        sweep.run_sweep(
            cells,
            {"uri": uri, "artifact_root": str(outputs / "mlartifacts"), "trace_spans": "store"},
            {"kind": "timed"},
            force=False,
        )
        == []
    )
    assert time.monotonic() - started >= len(cells) * SLOW_S  # the sweep waited for its logging before it returned
    assert max(launcher.held_s) < SLOW_S / 2, launcher.held_s
    rows = [row for row in runs_frame(uri) if row["cell_key"]]
    assert sorted(row["cell_key"] for row in rows if row["status"] == "FINISHED") == sorted(c.key for c in cells)
