"""Where the checkout is: `conf/`, `problems/`, `roofline_specs/` and `baselines/` are found from here. A leaf."""

import os
import shutil
import tempfile
from pathlib import Path
from typing import List

REPO_ROOT = Path(__file__).resolve().parent.parent


def user_cache() -> Path:
    """kbsweep's folder of the user's cache (what any outputs folder may reuse: references known good, an empty
    MLflow store)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kbsweep"


# the folders kbsweep's own processes make in the system's temporary folder (sockets need its short paths)
OWNED_KINDS = ("referee", "ranks", "proxy")


def owned_tempdir(kind: str) -> Path:
    """A private folder (mode 0700) in the system's temporary folder, named for this process
    (``kbsweep-KIND-PID-…``): one that a killed process leaves behind is removed by :func:`remove_orphans`."""
    assert kind in OWNED_KINDS, kind
    return Path(tempfile.mkdtemp(prefix=f"kbsweep-{kind}-{os.getpid()}-"))


def remove_orphans() -> List[Path]:
    """Removes the :func:`owned_tempdir` folders whose process is gone (a sweep or grade killed by SIGKILL, which
    no cleanup of its own outlives); kbsweep's commands call it as they start. Returns what it removed."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob("kbsweep-*-*-*"):
        kind, _, rest = path.name.removeprefix("kbsweep-").partition("-")
        pid = rest.partition("-")[0]
        if kind in OWNED_KINDS and pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def alive(pid: int) -> bool:
    """Whether a process of that id exists (one of another user's counts: it is not ours to judge)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
