"""The orchestrator: a sweep's cells → resume filter → launcher → tracking, with live progress.

Resume rules: a cell with a finished, non-infra run in the tracking store is skipped; a cell whose
``result.json`` journal exists but was never logged (the sweep died in between) is logged from disk without
running; a cell that ended in an infra outcome or never finished is redone from an empty folder (an infra
journal that was never logged is logged first). ``--force`` redoes every cell. One orchestrator per sweep and
outputs folder at a time (a lock file says so). A sweep's budget (:mod:`kbsweep.launch.budget`) may leave cells
unstarted: they are neither logged nor unfinished, and a rerun with a raised budget runs them.
"""

from __future__ import annotations

import fcntl
import json
import sys
import traceback
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from kbsweep.cell import RESULT_FILE, cell_busy, clear_for_rerun, reclaim
from kbsweep.errors import InfraError, KbsweepError
from kbsweep.launch.budget import Budget
from kbsweep.launch.launchers import make_launcher
from kbsweep.launch.workers import infra_result
from kbsweep.outcomes import Outcome
from kbsweep.planner.matrix import Cell, cell_dir
from kbsweep.tracking import snapshot
from kbsweep.tracking.cell_result import CellResult
from kbsweep.tracking.live import LiveCells
from kbsweep.tracking.mlflow_store import server_down
from kbsweep.tracking.tracker import Tracker, flatten, owner, result_id


class Progress:
    """Cells done and running, the ended ones by outcome, and dollars spent: a live rich bar on a terminal (with
    ``table()``, the running cells, under it), one line per event otherwise."""

    def __init__(
        self,
        total: int,
        console=None,
        table: Optional[Callable[[], Any]] = None,
        budget: Callable[[], str] = lambda: "",
    ):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        class Bar(RichProgress):
            def get_renderables(self):
                yield self.make_tasks_table(self.tasks)
                if table:
                    yield table()

        self.total, self.done, self.running, self.usd = total, 0, 0, 0.0
        self.outcomes: Counter = Counter()  # how the ended cells ended
        self.budget = budget  # the sweep budget's spent and reserved, or ""
        self.console = console or Console(stderr=True)
        self.bar = None
        if self.console.is_terminal:
            self.bar = Bar(
                TextColumn("[bold]kbsweep"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self.task = self.bar.add_task("cells", total=total, status=self.status())

    @property
    def infra(self) -> int:
        """The ended cells left in an infrastructure outcome: the sweep's next run redoes them."""
        return sum(n for outcome, n in self.outcomes.items() if outcome.is_infra)

    def status(self) -> str:
        ended = [
            f"{self.outcomes[o]} {o.value}" + (" (infra)" if o.is_infra else "") for o in Outcome if self.outcomes[o]
        ]
        return ", ".join([f"{self.running} running", *ended, f"${self.usd:.2f} spent"]) + self.budget()

    def line(self) -> str:
        return f"[kbsweep] {self.done}/{self.total} done, {self.status()}"

    def __enter__(self) -> "Progress":
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar:
            self.bar.stop()

    def show(self, note: str = "") -> None:
        if self.bar:
            self.bar.update(self.task, completed=self.done, status=self.status())
            if note:
                self.bar.console.print(f"[kbsweep] {note}", markup=False, highlight=False)
        else:
            print(f"{self.line()}{'  ' + note if note else ''}", file=sys.stderr, flush=True)


def journal(cell: Cell) -> Optional[Dict[str, Any]]:
    """The cell's result.json as stored (what a launcher hands back), or None."""
    path = cell_dir(cell) / RESULT_FILE
    return json.loads(path.read_text()) if path.exists() else None


@contextmanager
def sweep_lock(outputs: Path, sweep: str) -> Iterator[None]:
    """Exclusive per (outputs folder, sweep): a second orchestrator would run the same cells again."""
    path = outputs / "sweeps" / sweep / ".orchestrator.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise KbsweepError(
                f"sweep '{sweep}' is already running from {handle.read().strip() or 'another process'}; wait for it or stop it"
            ) from None
        handle.truncate(0)
        handle.write(owner())
        handle.flush()
        yield


def plan(
    cells: List[Cell], finished: Dict[str, str], logged: Set[str], force: bool
) -> Tuple[List[Cell], List[Cell], List[Cell]]:
    """(cells to run, cells to log from their journal, cells to run whose last journal, an infra or a forced one,
    was never logged: logged first so nothing is lost)."""
    todo, replay, salvage = [], [], []
    for cell in cells:
        if cell.key in finished:
            continue
        if cell_busy(cell) and not reclaim(cell):
            print(
                f"[kbsweep] {cell.label}: still held by an orphaned job that could not be stopped; left for the next run",
                file=sys.stderr,
            )
            continue
        stored = journal(cell)
        recorded = CellResult.from_json(stored) if stored else None
        if recorded and not force and not recorded.outcome.is_infra:
            replay.append(cell)
            continue
        if recorded and result_id(recorded) not in logged:
            salvage.append(cell)
        todo.append(cell)
    return todo, replay, salvage


def run_sweep(
    cells: List[Cell],
    tracking: Dict[str, Any],
    launcher: Dict[str, Any],
    force: bool,
    before: Callable[[List[Cell]], None] = lambda todo: None,
    budget: Optional[Budget] = None,
) -> List[Cell]:
    """Run every cell not already finished that ``budget`` admits (its ``held`` then lists those it did not); log
    each result as it comes back. ``before(cells to run)`` runs before anything launches (the preflight). Returns
    the cells still without a finished record (infrastructure outcomes, orphans that could not be stopped, results
    not logged), those held for the budget apart."""
    if not cells:
        return []
    with sweep_lock(Path(cells[0].paths["outputs"]), cells[0].sweep):
        saved = None if force else snapshot.load(history_path(cells[0]), tracking["uri"])
        if saved is not None and all(
            c.key in saved["finished"] for c in cells
        ):  # nothing to do: MLflow is not even imported
            announce(cells, len(cells), 0, 0, 0)
            return []
        return orchestrate(cells, tracking, launcher, force, before, budget or Budget())


def history_path(cell: Cell) -> Path:
    """The sweep's snapshot of its finished cells (:mod:`kbsweep.tracking.snapshot`)."""
    return Path(cell.paths["outputs"]) / "sweeps" / cell.sweep / ".history.json"


def read_history(tracker: Tracker, cell: Cell, uri: str) -> Tuple[Dict[str, str], Set[str]]:
    """The tracker's history, kept as the sweep's snapshot (stamped before the read)."""
    taken = snapshot.stamp(uri)
    finished, logged = tracker.history()
    snapshot.save(history_path(cell), uri, taken, {"finished": finished})
    return finished, logged


def announce(cells: List[Cell], skipped: int, replay: int, todo: int, stale: int) -> None:
    print(
        f"[kbsweep] sweep '{cells[0].sweep}': {len(cells)} cells, {skipped} already finished, {replay} to log from disk, "
        f"{todo} to run" + (f" ({stale} stale runs closed)" if stale else ""),
        file=sys.stderr,
    )


class Attempt:
    """Tracking must not stop a sweep: a call that fails prints why and returns None (the journal stays for the next
    run). A tracking server that stops answering is said once, in one line, and no call is made after it (each would
    wait out MLflow's retries): the cells finished meanwhile stay in their journals, unlogged, and the next run logs
    them."""

    def __init__(self, uri: str):
        self.uri = uri
        self.down: Optional[str] = None  # why the server stopped answering

    def __call__(self, action, *args) -> Any:
        if self.down:
            return None
        try:
            return action(*args)
        except Exception:
            self.down = server_down(self.uri)
            if self.down:
                print(
                    f"[kbsweep] tracking: no MLflow server answers at {self.uri} ({self.down}); nothing more is logged by this run, "
                    "finished cells' results stay on disk and the next run logs them",
                    file=sys.stderr,
                    flush=True,
                )
            else:
                traceback.print_exc(file=sys.stderr)
            return None


class InOrder:
    """The sweep's tracking work, run one call at a time in the order given, on a thread of its own, so the
    launcher's loop hands a free worker its next cell at once. Logging a finished cell (its batches, artifacts and
    trace) took ~1.2 s of the loop on a 2-core machine, and while it ran no free worker got a cell: a 100-cell
    demo sweep ran one cell at a time for most of its length (docs/benchmarks.md, "The 100-cell demo sweep"). An error in a
    call is raised in the caller's thread at its next ``submit``, or when the block ends, after every call given
    has run (a stopped sweep still logs the cells that finished)."""

    def __enter__(self) -> "InOrder":
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="kbsweep-tracking")
        self.pending: Deque[Future] = deque()
        return self

    def submit(self, call: Callable[..., None], *args: Any) -> None:
        self.raise_failed()
        self.pending.append(self.pool.submit(call, *args))

    def raise_failed(self) -> None:
        # the calls end in the order given: the ended ones are the queue's head (a scan of the whole queue at every
        # submit was quadratic in a backlog of thousands of instant cells)
        while self.pending and self.pending[0].done():
            self.pending.popleft().result()

    def __exit__(self, kind: Any, *exc: Any) -> None:
        self.pool.shutdown(wait=True)
        if kind is None:
            self.raise_failed()


def orchestrate(
    cells: List[Cell],
    tracking: Dict[str, Any],
    launcher: Dict[str, Any],
    force: bool,
    before: Callable[[List[Cell]], None],
    budget: Budget,
) -> List[Cell]:
    tracker = Tracker(tracking["uri"], tracking["artifact_root"], cells[0].sweep, tracking["trace_spans"])
    attempt = Attempt(tracking["uri"])
    stale = tracker.close_stale()
    finished, logged_results = read_history(tracker, cells[0], tracking["uri"])
    todo, replay, salvage = plan(cells, {} if force else finished, logged_results, force)
    skipped = len(cells) - len(todo) - len(replay)
    announce(cells, skipped, len(replay), len(todo), stale)
    budget.count(cell_dir(cells[0]).parent, {c.key for c in todo})
    if (
        not (replay or salvage) and todo and not budget.fits(todo[0])
    ):  # the budget starts nothing: no preflight, no parent run
        print(f"[kbsweep] {budget.hold(todo)}", file=sys.stderr)
        todo = []
    if not (todo or replay or salvage):  # no parent run for an invocation that logs nothing
        return unfinished(cells, finished, budget)
    runner = make_launcher(launcher)
    runner.budget = budget
    runner.check(
        todo
    )  # a cell the launcher cannot run (too few GPUs) is refused before the preflight's requests and any run
    before(todo)
    tracker.start_sweep(
        {"launcher": launcher["kind"], "force": str(force), **flatten("launcher", launcher, {})}, len(cells)
    )
    unlogged: List[str] = []

    def log(cell: Cell, run_id: Optional[str], result: CellResult, live_metrics: Sequence[tuple] = ()) -> None:
        """Log a cell's result (and the live metrics not logged yet) to its run (started if None); the history
        follows what this invocation logged."""
        run_id = run_id or attempt(tracker.start_cell, cell)
        logged = attempt(tracker.finish_cell, run_id, result, live_metrics) if run_id else None
        if logged is None:
            unlogged.append(cell.key)
        elif not result.outcome.is_infra:
            finished[cell.key] = logged

    for cell in salvage:
        stored = journal(cell)
        assert stored is not None  # plan salvages a cell for its journal, which the sweep's lock keeps
        log(cell, None, CellResult.from_json(stored))
    todo = [c for c in todo if c.key not in unlogged]  # an unlogged journal is neither cleared nor redone
    for cell in todo:
        clear_for_rerun(
            cell, keep=not force
        )  # an infra result, a forced one, or a half-written cell: a finished agent's work stays
    run_ids: Dict[str, Optional[str]] = {}
    started: Dict[str, Cell] = {}  # the cells by key, as they start
    live = LiveCells(lambda run_id, metrics: attempt(tracker.log_batch, run_id, None, None, metrics))

    with Progress(len(todo) + len(replay), table=live.table, budget=budget.status) as progress, live:
        if not progress.bar:
            live.say = lambda line: print(f"[kbsweep] {line}", file=sys.stderr, flush=True)

        def start(cell: Cell) -> None:
            started[cell.key] = cell
            run_ids[cell.key] = attempt(tracker.start_cell, cell)
            live.add(cell.key, cell.label, run_ids[cell.key], cell_dir(cell) / "transcript.jsonl")
            progress.running += 1
            progress.show(f"started {cell.label}")

        def done(cell: Cell, stored: Dict[str, Any]) -> None:
            result = CellResult.from_json(stored)  # launchers carry the journal as stored (pickled, or read from disk)
            log(cell, run_ids.pop(cell.key, None), result, live.finish(cell.key))
            progress.running -= 1
            progress.done += 1
            progress.usd += result.cost_usd or 0.0
            progress.outcomes[result.outcome] += 1
            score = result.score
            progress.show(
                f"{cell.label}: {result.outcome.value}" + (f" score={score:.4g}" if score is not None else "")
            )

        def interrupted() -> None:
            """Ctrl-C: the launcher has stopped the running cells; their runs are closed, and what is left is said."""
            for run_id in filter(None, run_ids.values()):
                attempt(tracker.stop_run, run_id)
            print(
                f"[kbsweep] interrupted: {progress.done} of {len(todo) + len(replay)} cells finished and logged, {len(run_ids)} stopped; "
                "the same command resumes the rest",
                file=sys.stderr,
                flush=True,
            )

        def refused(reason: str) -> None:
            """The launcher gave up on its cells (Slurm refused a job): those started and not done end now as
            infrastructure outcomes (``node_failure``), their runs closed; a rerun runs them."""
            for key in list(run_ids):
                done(started[key], infra_result(started[key], Outcome.NODE_FAILURE, reason))

        status = "FAILED"
        try:
            with InOrder() as logging_calls:
                on_start = lambda cell: logging_calls.submit(start, cell)  # noqa: E731
                on_done = lambda cell, stored: logging_calls.submit(done, cell, stored)  # noqa: E731
                for cell in replay:
                    on_start(cell)
                    on_done(cell, journal(cell))
                try:
                    runner.run(todo, on_start, on_done)
                    held = budget.hold(todo)
                except KeyboardInterrupt:
                    logging_calls.submit(interrupted)
                    status = "KILLED"
                    raise
                except InfraError as exc:
                    logging_calls.submit(refused, str(exc))
                    raise
            status = "FINISHED" if not progress.infra and not unlogged else "FAILED"
        finally:
            summary = {
                "cells_run": len(todo) - len(budget.held),
                "cells_replayed": len(replay),
                "cells_salvaged": len(salvage),
                "cells_skipped": skipped,
                "cells_failed": progress.infra,
                "cells_unlogged": len(unlogged),
                "cells_not_started_budget": len(budget.held),
                "usd": progress.usd,
            }
            attempt(tracker.end_sweep, status, summary)
    if held:
        print(f"[kbsweep] {held}", file=sys.stderr)
    if unlogged:
        print(
            f"[kbsweep] {len(unlogged)} results are on disk but not in tracking; run the sweep again to log them",
            file=sys.stderr,
        )
    # the history as logged here, not read back (a search of every cell run of the sweep: ~35 s at 10 000 cells),
    # stamped after the last write: one orchestrator per sweep, so no other process logged its cells meanwhile
    attempt(
        snapshot.save, history_path(cells[0]), tracking["uri"], snapshot.stamp(tracking["uri"]), {"finished": finished}
    )
    return unfinished(cells, finished, budget)


def unfinished(cells: List[Cell], finished: Dict[str, str], budget: Budget) -> List[Cell]:
    """The cells without a finished record, but those the budget held."""
    held = {cell.key for cell in budget.held}
    return [c for c in cells if c.key not in finished and c.key not in held]
