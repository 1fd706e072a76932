"""Pid 1 of a sandbox's pid namespace. bubblewrap runs ``--as-pid-1`` and execs :data:`INIT`, so no process in the
sandbox holds bubblewrap's command line (the binds, the host's paths) in its ``/proc/<pid>/cmdline`` or memory.

The init is bash. It reads the command, NUL-separated, from the descriptor named by its one argument (so its own
command line names no path: ``/bin/bash -c INIT kbsweep-init 5``) and closes it; starts the command as its child
with job control on (the command keeps the caller's stdin and signal dispositions, where a plain ``&`` would give
it /dev/null and ignore SIGINT and SIGQUIT; job notices go to the init's stderr, /dev/null); keeps no descriptor
but 0-2, as bubblewrap's own init does; reaps orphans; and exits with the command's status (128 + the signal when a
signal ended it), which bubblewrap passes on. bubblewrap's ``--die-with-parent`` holds for the init, which never
changes its uid (as root, the command's chain drops to the sandbox's uid itself): when it dies, the kernel ends
the whole namespace.
"""

from __future__ import annotations

import os
from typing import Sequence

INIT = (
    'readarray -d "" -t cmd <&"$1"; eval "exec $1<&-"; exec {err}>&2 2>/dev/null; set -m; "${cmd[@]}" 2>&$err {err}>&- & '
    'for f in /proc/self/fd/*; do f=${f##*/}; ((f > 2)) && eval "exec $f>&-"; done; '
    "if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] > 500)); then wait -f $!; else wait $!; fi"
)
NAME = "kbsweep-init"  # the init's $0


def command_fd(command: Sequence[str]) -> int:
    """A memfd holding ``command`` NUL-separated, read from its start (close-on-exec: pass it in ``pass_fds``; the
    caller closes its own copy once the sandbox has started)."""
    fd = os.memfd_create("kbsweep-command")
    os.write(fd, b"".join(os.fsencode(arg) + b"\0" for arg in command))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
