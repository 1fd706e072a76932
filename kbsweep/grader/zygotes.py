"""The orchestrator's side of the grading zygotes (:mod:`kbsweep.grader.shared.zygote` runs inside them): a zygote
is started once per (side, sandbox view, environment, policy), kept in a pool of idle ones, asked over its control
socket to fork a grade's process, and stopped with its sandbox. A grade that breaches a limit or ends oddly
discards both its zygotes; every zygote still open is closed when the process exits."""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, overload

from kbsweep.grader.shared.zygote import BOOT
from kbsweep.paths import REPO_ROOT
from kbsweep.sandbox.watch import kill, process_tree

WAIT_S = 10.0  # for a zygote to report a killed child's exit
KEEP = 2  # zygotes kept per side (a sweep alternating between two problems keeps both warm)


def host_pid(root: int, inner: int) -> Optional[int]:
    """The host's pid of the process that is ``inner`` in the pid namespace under ``root``."""
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/status") as fh:
                line = next(line for line in fh if line.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if int(line.split()[-1]) == inner:
            return pid
    return None


class Forked:
    """A zygote's child, as much of ``subprocess.Popen`` as the grade's watch uses (pid, poll, wait)."""

    def __init__(self, zygote: "Zygote", pid: int):
        self.zygote, self.pid = zygote, pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.returncode = self.zygote.status(0.0)
        return self.returncode

    def wait(self, timeout: float = WAIT_S) -> int:
        """The exit code; a zygote that does not report it in time (stopped by a candidate, say) is taken as dead."""
        if self.returncode is None:
            self.returncode = self.zygote.status(timeout)
            if self.returncode is None:
                self.zygote.close()
                self.returncode = -signal.SIGKILL
        return self.returncode


class Zygote:
    """One warm zygote: its sandboxed process and the orchestrator's end of its control socket."""

    def __init__(self, side: str, sandbox, env: Dict[str, str], readonly: Sequence[Path], home: Path, log: Path):
        self.side, self.home, self.key = side, home, ()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message per read
        self.control = ours
        command = [
            sys.executable,
            *(["-I", "-B"] if side == "runner" else []),
            "-c",
            BOOT.format(root=str(REPO_ROOT)),
            side,
            str(theirs.fileno()),
        ]
        with open(log, "ab") as out:
            self.proc = sandbox.popen(
                command,
                cwd=str(home),
                env=env,
                writable=[(home, str(home))],
                readonly=readonly,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),),
            )
        theirs.close()
        self.ready = False
        LIVE.add(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    @overload
    def message(self, timeout: None) -> Dict[str, Any]: ...
    @overload
    def message(self, timeout: Optional[float]) -> Optional[Dict[str, Any]]: ...

    def message(self, timeout: Optional[float]) -> Optional[Dict[str, Any]]:
        """The zygote's next message, None when none came within ``timeout`` (waits for one without a timeout;
        raises once it is gone)."""
        if not select.select([self.control], [], [], timeout)[0]:
            return None
        data = self.control.recv(1 << 16)
        if not data:
            raise OSError(f"the {self.side} zygote ended")
        return json.loads(data)

    def started(self) -> None:
        """Wait until the zygote has imported its side (raises OSError if it died trying)."""
        if not self.ready:
            self.ready = bool(self.message(None))

    def fork(self, cwd: Path, argv: Sequence[str], fds: Dict[str, int], entry: Optional[str] = None) -> Forked:
        """A child running the side's ``main`` (or ``entry``'s, one of the side's :data:`~kbsweep.grader.shared.zygote.ENTRIES`) with ``argv``
        (``fd:<name>`` items become the child's numbers of the passed descriptors ``fds``: stdin, stdout and
        stderr among them)."""
        self.started()
        names = list(fds)
        request = {"side": self.side, "cwd": str(cwd), "argv": list(argv), "fds": names, "entry": entry}
        socket.send_fds(self.control, [json.dumps(request).encode()], [fds[n] for n in names])
        reply = self.message(None)
        pid = host_pid(self.proc.pid, int(reply["pid"]))
        if pid is None:
            raise OSError(f"the {self.side} zygote's child {reply['pid']} is not under it")
        return Forked(self, pid)

    def run(self, entry: str, text: str, timeout_s: float) -> Tuple[int, str, str]:
        """(exit code, stdout, stderr) of a child running ``entry``'s ``main`` on ``text`` (stdin, under 64 KiB:
        written whole before reading); past ``timeout_s`` the zygote is closed and TimeoutExpired raised."""
        self.started()  # the zygote's own start-up is not the child's time
        deadline = time.monotonic() + timeout_s
        (stdin, feed), (out_read, out), (err_read, err) = os.pipe(), os.pipe(), os.pipe()
        try:
            forked = self.fork(self.home, [], {"stdin": stdin, "stdout": out, "stderr": err}, entry)
        finally:
            for fd in (stdin, out, err):
                os.close(fd)
        with os.fdopen(feed, "wb") as fh:
            fh.write(text.encode())
        read: Dict[int, List[bytes]] = {out_read: [], err_read: []}
        pending = list(read)
        try:
            while pending:
                ready = select.select(pending, [], [], max(deadline - time.monotonic(), 0.0))[0]
                if not ready:
                    self.close()
                    raise subprocess.TimeoutExpired(entry, timeout_s)
                for fd in ready:
                    data = os.read(fd, 1 << 16)
                    read[fd].append(data) if data else pending.remove(fd)
        finally:
            for fd in read:
                os.close(fd)
        return (
            forked.wait(),
            b"".join(read[out_read]).decode(errors="replace"),
            b"".join(read[err_read]).decode(errors="replace"),
        )

    def status(self, timeout: Optional[float]) -> Optional[int]:
        """The last child's exit code once the zygote reports it (swept), else None; -SIGKILL if the zygote died."""
        try:
            reply = self.message(timeout)
        except (OSError, ValueError):
            return -signal.SIGKILL
        return None if reply is None else int(reply["status"])

    def stop(self) -> None:
        """End the zygote's sandbox, every process in it; its home stays (see :meth:`close`)."""
        self.control.close()
        if self.alive():
            kill(self.proc, settle_s=2.0)

    def close(self) -> None:
        self.stop()
        LIVE.discard(self)
        shutil.rmtree(self.home, ignore_errors=True)
        self.home.with_suffix(".log").unlink(missing_ok=True)


POOL: Dict[Tuple, List[Zygote]] = {}  # idle zygotes by key
LIVE: Set[Zygote] = set()  # every zygote not closed, idle or taken: all closed at exit


def pool_key(side: str, sandbox, env: Dict[str, str], readonly: Sequence[Path], parent: Optional[Path]) -> Tuple:
    # the runner's home holds the candidates staged for it, so its folder is part of its key; the referee's is not
    return (
        side,
        sandbox.policy,
        sandbox.gpu,
        tuple(sorted(env.items())),
        tuple(map(str, readonly)),
        str(parent) if side == "runner" else "",
    )


def take(side: str, sandbox, env: Dict[str, str], readonly: Sequence[Path], parent: Optional[Path] = None) -> Zygote:
    """A warm zygote of ``side`` for this view and environment, out of the pool (started now if none is idle).
    Its writable home and its log are made under ``parent`` (the outputs folder's ``zygotes/``: a process killed
    mid-sweep leaves them there, never in the system's temporary folder), else under the system's temporary folder.
    Give it back with :func:`keep`, or :func:`discard` it."""
    key = pool_key(side, sandbox, env, readonly, parent)
    idle = POOL.get(key, [])
    while idle:
        found = idle.pop()
        if found.alive():
            return found
        found.close()
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix=f".kbsweep-{side}-", dir=parent))
    found = Zygote(side, sandbox, env, readonly, home, home.with_suffix(".log"))
    found.key = key
    return found


def keep(found: Zygote) -> None:
    """Back into the pool, most recently used last; the least recently used of a side past KEEP are closed."""
    POOL.setdefault(found.key, []).append(found)
    POOL[found.key] = POOL.pop(found.key)
    idle = [z for k, zs in POOL.items() if k[0] == found.side for z in zs]
    for stale in idle[:-KEEP]:
        discard(stale)


def prewarm(side: str, sandbox, env: Dict[str, str], readonly: Sequence[Path], parent: Optional[Path] = None) -> None:
    """Start a zygote now (its imports run while the agent works) unless one is idle for this key."""
    if not any(z.alive() for z in POOL.get(pool_key(side, sandbox, env, readonly, parent), [])):
        keep(take(side, sandbox, env, readonly, parent))


def discard(*zygotes: Zygote) -> None:
    """Close these zygotes (a grade that breached a limit or ended oddly): the next grade starts fresh ones."""
    for found in zygotes:
        for idle in POOL.values():
            if found in idle:
                idle.remove(found)
        found.close()


@atexit.register
def close_all() -> None:
    for found in list(LIVE):
        found.close()
    POOL.clear()
