"""Live progress: a running cell's transcript lines become MLflow metrics of its run as they are written (real
sqlite store), a half-written line waits for the next read, and off a terminal each turn is one plain line."""

from __future__ import annotations

import json

from kbsweep.tracking.cell_result import CellResult
from kbsweep.tracking.live import LiveCells
from kbsweep.tracking.tracker import Tracker
from tests.test_tracking import make_cell, write_result


def append(path, *events):
    with path.open("a") as fh:
        fh.write("".join(json.dumps(e) + "\n" for e in events))


def test_running_cell_metrics_reach_mlflow_while_it_runs(store):  # noqa: F811
    outputs, uri = store
    cell = make_cell(outputs)
    tracker = Tracker(uri, str(outputs / "mlartifacts"), "demo")
    run_id = tracker.start_cell(cell)
    transcript = outputs / "transcript.jsonl"
    said = []
    live = LiveCells(lambda rid, metrics: tracker.log_batch(rid, metrics=metrics), said.append)
    live.add(cell.key, cell.label, run_id, transcript)
    live.poll()  # no transcript yet: nothing
    append(
        transcript,
        {"ts": 1.0, "type": "user", "content": "go"},
        {"ts": 2.0, "type": "assistant", "usage": {"input_tokens": 100, "output_tokens": 10}, "cost_usd": 0.5},
    )
    with transcript.open("a") as fh:
        fh.write('{"ts": 3.0, "type": "step", "turn": 1, "tok')  # still being written
    live.poll()
    history = lambda key: [(m.step, m.value) for m in tracker.client.get_metric_history(run_id, key)]  # noqa: E731
    assert (
        history("live.tokens") == [(1, 110)] and history("live.usd") == [(1, 0.5)] and history("live.best_score") == []
    )
    with transcript.open("a") as fh:
        fh.write('ens": 110, "usd": 0.5, "best_score": 0.25}\n')
    append(
        transcript,
        {"ts": 4.0, "type": "assistant", "usage": {"input_tokens": 200, "output_tokens": 20}, "cost_usd": 1.0},
    )
    live.poll()
    assert history("live.tokens") == [(1, 110), (2, 330)] and history("live.best_score") == [(1, 0.25)]
    assert said[-1] == f"{cell.label}: turn 2, 330 tokens, $1.50, best check 0.25"
    assert "turn" in [c.header for c in live.table().columns]
    append(transcript, {"ts": 5.0, "type": "step", "turn": 2, "best_score": 0.5})  # written after the last poll
    rest = live.finish(cell.key)  # an ending cell is read to its end, its rest logged with its final metrics
    assert rest == [("live.best_score", 0.5, 2)] and history("live.best_score") == [(1, 0.25)]
    tracker.finish_cell(run_id, CellResult.from_json(write_result(cell)), rest)
    assert history("live.best_score") == [(1, 0.25), (2, 0.5)] and history("score") == [(0, 0.4)]
    append(transcript, {"ts": 6.0, "type": "assistant", "usage": {"input_tokens": 1, "output_tokens": 1}})
    live.poll()  # and no longer read after it
    assert len(history("live.tokens")) == 2
