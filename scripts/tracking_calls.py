"""Where the orchestrator's tracking time goes, call by call: an instant sweep (conf/model/instant.yaml on
conf/track/instant.yaml, as scripts/scale_cost.py runs it) through the ordinary CLI, in this process, with each
MLflow client call, trace export and artifact copy wrapped. Per call name: how often it ran a cell, its thread CPU
a cell and the SQL statements it sent a cell, each counted to the innermost wrapped call running (so an exporter's
store calls are not counted twice; each thread's own), and the commits (store transactions) a cell.

    python scripts/tracking_calls.py OUTPUTS_ROOT OUT.json [CELLS] [--set KEY=VALUE ...]    (default 200 cells)

``--set`` adds overrides to the sweep (``tracking.trace_spans=store``: a cell's spans as rows of the store).

kbsweep is imported as Python finds it, so run from another checkout's root (``cd CHECKOUT && python -c "import
runpy, sys; sys.argv = [...]; runpy.run_path('.../scripts/tracking_calls.py', run_name='__main__')"``) to measure
that commit side by side; the record names the checkout measured and the wrapped calls it lacks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from scale_cost import SWEEP, host  # noqa: E402  (the same sweep as the scale benchmark)

WRAPPED = {  # module: class: methods
    "mlflow.tracking.client": {"MlflowClient": ["create_run", "log_batch", "set_terminated"]},
    "mlflow.tracing.client": {"TracingClient": ["log_spans", "start_trace"]},
    "kbsweep.agent.mlflow_trace": {"TraceWriter": ["log"], "StoreExporter": ["upload"]},
    "mlflow.store.artifact.local_artifact_repo": {"LocalArtifactRepository": ["log_artifact"]},
    "kbsweep.tracking.tracker": {"Tracker": ["start_cell", "finish_cell"]},
}


class Calls:
    """Per call name: calls, exclusive thread CPU and SQL statements; commits counted the same way."""

    def __init__(self) -> None:
        self.local = threading.local()  # each thread's stack of wrapped calls and its CPU clock's last reading
        self.totals: Dict[str, Dict[str, float]] = defaultdict(lambda: defaultdict(float))

    @property
    def stack(self) -> List[str]:
        if not hasattr(self.local, "stack"):
            self.local.stack, self.local.mark = [], time.thread_time()
        return self.local.stack

    def charge(self) -> None:
        stack, now = self.stack, time.thread_time()
        if stack:
            self.totals[stack[-1]]["cpu_s"] += now - self.local.mark
        self.local.mark = now

    def wrap(self, name: str, real: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.charge()
            self.stack.append(name)
            self.totals[name]["calls"] += 1
            try:
                return real(*args, **kwargs)
            finally:
                self.charge()
                self.stack.pop()

        return call

    def count(self, kind: str) -> None:
        if self.stack:
            self.totals[self.stack[-1]][kind] += 1


def instrument(calls: Calls) -> List[str]:
    """Wrap every call of WRAPPED this checkout has; returns those it lacks (an older commit measured side by side)."""
    import importlib

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    absent = []
    for module_name, classes in WRAPPED.items():
        module = importlib.import_module(module_name)
        for class_name, methods in classes.items():
            cls = getattr(module, class_name, None)
            if cls is None:
                absent.append(f"{module_name}.{class_name}")
                continue
            for method in methods:
                setattr(cls, method, calls.wrap(f"{class_name}.{method}", getattr(cls, method)))
    event.listen(Engine, "before_cursor_execute", lambda *a: calls.count("statements"))
    event.listen(Engine, "commit", lambda *a: calls.count("commits"))
    return absent


def main(root: Path, out: Path, cells: int, overrides: List[str]) -> None:
    outputs = root / f"calls-{cells}"
    shutil.rmtree(outputs, ignore_errors=True)
    os.environ.update(KBSWEEP_OUTPUTS=str(outputs), KBSWEEP_LOCK_DIR=str(outputs / "locks"))
    calls = Calls()
    absent = instrument(calls)
    from kbsweep.cli import main as kbsweep

    sys.argv = ["kbsweep", *SWEEP, *overrides, f"repeat=range(0,{cells // 2})"]
    try:
        kbsweep()
    except SystemExit as stop:
        if stop.code:
            raise
    logged = calls.totals["Tracker.finish_cell"]["calls"] or 1
    table = {
        name: {
            "calls_per_cell": t["calls"] / logged,
            "cpu_ms_per_cell": 1000 * t["cpu_s"] / logged,
            "statements_per_cell": t["statements"] / logged,
            "commits_per_cell": t["commits"] / logged,
        }
        for name, t in sorted(calls.totals.items())
    }
    total = {
        key: sum(row[key] for row in table.values())
        for key in ("cpu_ms_per_cell", "statements_per_cell", "commits_per_cell")
    }
    measured = (
        Path(sys.modules["kbsweep"].__file__).resolve().parent.parent
    )  # first on sys.path, maybe not this script's
    record = {
        "host": host(measured),
        "checkout": str(measured),
        "overrides": overrides,
        "cells": int(logged),
        "calls": table,
        "total": total,
        "not_in_this_checkout": absent,
    }
    out.write_text(json.dumps(record, indent=1))
    for name, row in table.items():
        print(
            f"{name:36} {row['calls_per_cell']:5.2f}  {row['cpu_ms_per_cell']:6.1f} ms  {row['statements_per_cell']:6.1f} stmts"
            f"  {row['commits_per_cell']:4.1f} commits",
            file=sys.stderr,
        )
    print(
        f"{'total':36} {'':5}  {total['cpu_ms_per_cell']:6.1f} ms  {total['statements_per_cell']:6.1f} stmts  {total['commits_per_cell']:4.1f} commits",
        file=sys.stderr,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the orchestrator's tracking calls, one by one")
    parser.add_argument("root", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("cells", type=int, nargs="?", default=200)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    main(args.root, args.out, args.cells, args.overrides)
