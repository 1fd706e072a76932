"""Pre-warmed grading processes, the half that runs inside the sandbox: a sandboxed parent that has imported torch and
one side's modules, holds nothing of any grade, and forks that side's process per grade (docs/grading.md,
"Start-up"). The orchestrator starts, pools and stops them (:mod:`kbsweep.grader.zygotes`).

A zygote is started once per (side, sandbox view, environment, policy) and lives as long as the process that
grades (bubblewrap's ``--die-with-parent``). Each grade asks it, over a socket pair only the orchestrator holds, to
fork: the request carries the child's descriptors (stdin, stdout, stderr, the result pipe, the channel), never
the grade's contents; the child closes the control socket before anything of the grade reaches it, so the
referee's secrets reach the referee's child alone and the candidate never holds a line to its zygote.

The runner's zygote shares its sandbox with the candidates it forks, so between grades it ends every other
process of that sandbox (``kill(-1)`` in its own pid namespace; the referee's zygote does the same: nothing a
referee started outlives its grade), empties ``/tmp``, ``/dev/shm`` and the sandbox's System V IPC, and the
orchestrator re-stages the candidate folder: a candidate leaves nothing behind for the next. It is not dumpable (a
candidate of the same uid cannot ptrace it or write its memory) and reaps orphans (a subreaper). A grade that
breaches a limit or ends oddly discards both zygotes. Zygotes run only under bubblewrap: unconfined
(``sandbox.mode=unsafe``) there is no namespace to sweep, and grades are spawned cold.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import traceback
from typing import Any, Dict, List, Optional, Tuple

BOOT = "import sys; sys.path.append({root!r}); from kbsweep.grader.shared.zygote import serve; serve()"
MODULES = {"runner": "kbsweep.grader.runner.runner", "referee": "kbsweep.grader.referee.referee"}
# other modules whose ``main`` a side's child may run, named by the orchestrator's request: the referee's zygote
# also probes references (deck code, which its grades run anyway), so a grade's probe pays no torch import of its own
ENTRIES = {"runner": (), "referee": ("kbsweep.planner.validate",)}
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
MAX_FDS = 8


def receive(sock: socket.socket) -> Tuple[Optional[Dict[str, Any]], List[int]]:
    data, fds, _, _ = socket.recv_fds(sock, 1 << 16, MAX_FDS)
    return (json.loads(data) if data else None), fds


def sweep_sandbox() -> None:
    """End every other process of this pid namespace (bubblewrap's init excepted), reap them, and empty the
    sandbox's scratch: what a candidate left must not meet the next one."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    for folder in ("/tmp", "/dev/shm"):
        empty(folder)
    subprocess.run(["ipcrm", "--all"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def empty(folder: str) -> None:
    """Remove what ``folder`` holds, never crossing into another filesystem: the host folders bound under /tmp
    (the candidate's, when the grade's logs live there) and the folders leading to them stay."""
    device = os.lstat(folder).st_dev
    walked = []
    for root, dirs, files in os.walk(folder):
        links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
        for name in files + links:
            path = os.path.join(root, name)
            if os.lstat(path).st_dev == device:  # a file bound from the host (a problem's file) is a mount: left alone
                os.unlink(path)
        dirs[:] = [d for d in dirs if d not in links and os.lstat(os.path.join(root, d)).st_dev == device]
        walked += [os.path.join(root, d) for d in dirs]
    for path in reversed(walked):
        try:
            os.rmdir(path)
        except OSError:  # holds a mount point
            pass


def child(control: socket.socket, request: Dict[str, Any], fds: List[int], module) -> None:
    """The forked grading process: its own session, its descriptors in place, then the side's ``main``."""
    control.close()
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # as a freshly spawned process is
    names = dict(zip(request["fds"], fds))
    for target, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        os.dup2(names.pop(name), target)
    os.chdir(request["cwd"])
    sys.argv = [request["side"], *(str(names[a[3:]]) if a.startswith("fd:") else a for a in request["argv"])]
    entry = request.get("entry")
    if entry is not None and entry not in ENTRIES[request["side"]]:
        raise ValueError(f"the {request['side']} zygote runs no {entry}")
    (importlib.import_module(entry) if entry else module).main()
    sys.stdout.flush()  # os._exit skips it
    sys.stderr.flush()
    os._exit(0)


def serve() -> None:
    """A zygote's loop (``python ... <side> <control fd>``): import the side's modules, then fork one process per
    request and report its pid and, once reaped, its exit status."""
    side, control = sys.argv[-2], socket.socket(fileno=int(sys.argv[-1]))
    module = importlib.import_module(MODULES[side])  # torch with it: the cost this process exists to pay once
    getattr(module, "warm", lambda: None)()  # the side's other one-time set-up, before any fork
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    control.sendall(b'{"ready": true}')
    while True:
        request, fds = receive(control)
        if request is None:
            os._exit(0)
        sweep_sandbox()
        pid = os.fork()
        if pid == 0:
            try:
                child(control, request, fds, module)
            except BaseException:  # on the child's stderr: os._exit below skips Python's own report
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
        control.sendall(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        sweep_sandbox()  # the referee's too: what its child left (torch.compile's workers, say) goes as a cold sandbox's would
        control.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode())
