"""How a local cell's job runs and ends: warm workers (long-lived processes that run cells one after another over
a length-prefixed pickle protocol on their stdin and stdout), a job's watch on the orchestrator (the job ends with
its whole tree once the orchestrator is gone) and the result of a job that ended without one. The launchers that
submit jobs are :mod:`kbsweep.launch.launchers`'s."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from kbsweep.grader.torchrun import kill_tree
from kbsweep.outcomes import Outcome
from kbsweep.planner.matrix import Cell
from kbsweep.tracking.tracker import owner_alive

Job = Callable[[Cell, Optional[str]], Dict[str, Any]]  # job(cell, visible GPUs) -> the cell's result
POLL_S = 0.5


def end_when_gone(supervisor: str) -> None:
    import psutil

    while owner_alive(supervisor):
        time.sleep(POLL_S)
    for child in psutil.Process().children():
        kill_tree(child.pid)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def grading_of(cell: Cell) -> tuple:
    """What a cell's grades fork their zygotes for: its problem on its GPU kind under its track."""
    return cell.problem_dir, cell.gpu.name, cell.track["name"]


def infra_result(cell: Cell, outcome: Outcome, message: str) -> Dict[str, Any]:
    return {"outcome": outcome.value, "message": message, "key": cell.key, "cell": cell.label, "finished": time.time()}


FRAME = struct.Struct("<Q")  # a length prefix: one pickled (job, cell, visible GPUs) in, one pickled result out


def send_frame(stream, payload: bytes) -> None:
    stream.write(FRAME.pack(len(payload)) + payload)
    stream.flush()


def read_frame(stream) -> Optional[bytes]:
    """The next frame, None at the end of the stream (or a torn frame: its writer died)."""
    head = stream.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    payload = stream.read(FRAME.unpack(head)[0])
    return payload if len(payload) == FRAME.unpack(head)[0] else None


class Worker:
    """A local process that runs cells one after another (:func:`serve_cells`), so its imports and its grading
    zygotes stay warm from one cell to the next. It is a session and process group of its own, ended with its
    whole tree like a fresh job's when its cell passes the cap or the orchestrator goes."""

    def __init__(self, folder: Path, supervisor: str, answered: threading.Event):
        import cloudpickle

        self.pickle = cloudpickle
        self.log = folder / f"worker-{time.time_ns()}.log"
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from kbsweep.launch.workers import serve_cells; serve_cells()", supervisor],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both PIPEs
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.job_id = str(self.proc.pid)
        self.result: Optional[Dict[str, Any]] = None
        self.cell: Optional[Cell] = None  # the last one it was given
        self.finished = threading.Event()
        self.answered = answered  # the launcher's: some worker answered

    def start(self, job: Job, cell: Cell, visible: Optional[str]) -> None:
        self.result, self.cell = None, cell
        self.finished.clear()
        send_frame(self.stdin, self.pickle.dumps((job, cell, visible)))
        threading.Thread(target=self.receive, daemon=True).start()

    def receive(self) -> None:
        payload = read_frame(self.stdout)
        self.result = self.pickle.loads(payload) if payload is not None else None
        self.finished.set()
        self.answered.set()

    def done(self) -> bool:
        return self.finished.is_set()

    def kill(self) -> None:
        kill_tree(self.proc.pid)
        self.proc.wait()

    def close(self) -> None:
        """Let an idle worker exit on its own (its zygotes are closed at its exit; the stdin of each worker is
        closed first, so they wind down together)."""
        if not self.stdin.closed:
            self.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def serve_cells() -> None:
    """A worker's loop: (job, cell, visible GPUs) frames in on stdin, each ``job(cell, visible)``'s result out on
    a private copy of stdout (the cells' own prints go to stderr, the worker's log); ends at the end of stdin,
    or with its process group once the orchestrator (``sys.argv[-1]``, a process stamp) is gone."""
    import pickle

    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    threading.Thread(target=end_when_gone, args=(sys.argv[-1],), daemon=True).start()
    while (payload := read_frame(sys.stdin.buffer)) is not None:
        job, cell, visible = pickle.loads(payload)
        try:
            result = job(cell, visible)
        except Exception as exc:  # noqa: BLE001 - the job's failure is the cell's node failure, not the worker's
            result = infra_result(
                cell, Outcome.NODE_FAILURE, f"worker {os.getpid()} failed: {type(exc).__name__}: {exc}"[:300]
            )
        send_frame(replies, pickle.dumps(result))
