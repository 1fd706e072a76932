"""What kbsweep last read from a local tracking store, reused while the store's file is unchanged.

A resumed sweep whose every cell is finished, and the report that follows it, need nothing from MLflow but what
the previous invocation read, so long as nobody has written to the store since. For an SQLite store that is
checkable without MLflow (whose import alone takes seconds): the database file and its journal have the same
size, inode and modification time as when the reading began. A snapshot records that stamp, taken *before* the
read it keeps (a write racing the read changes the file after the stamp, so the snapshot is never trusted again).
A server store has no such stamp: everything is read afresh.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

SQLITE = "sqlite:///"


def stamp(uri: str) -> Optional[List[List[int]]]:
    """(inode, size, mtime_ns) of an SQLite store's database and journals; None for any other store (or none yet)."""
    if not uri.startswith(SQLITE):
        return None
    path = Path(uri[len(SQLITE) :])
    found = []
    for suffix in ("", "-wal", "-journal"):
        try:
            info = os.stat(f"{path}{suffix}")
        except FileNotFoundError:
            found.append([0, 0, 0])
            continue
        found.append([info.st_ino, info.st_size, info.st_mtime_ns])
    return found if found[0][0] else None


def load(path: Path, uri: str) -> Optional[Dict[str, Any]]:
    """The snapshot at ``path`` if it was read from ``uri`` and the store has not changed since, else None."""
    current = stamp(uri)
    if current is None or not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except ValueError:
        return None
    return saved["data"] if saved.get("uri") == uri and saved.get("stamp") == current else None


def save(path: Path, uri: str, taken: Optional[List[List[int]]], data: Dict[str, Any]) -> None:
    """Keep ``data``, read from ``uri`` after ``taken`` (a :func:`stamp`); nothing when the store has none."""
    if taken is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"uri": uri, "stamp": taken, "data": data}, default=str))
    tmp.replace(path)
