"""Files parsed once per version: a sweep reads each problem.yaml and roofline spec once per cell and again to
check it (hundreds of OmegaConf merges for a 100-cell sweep). A version is the file's (path, modification time,
size); each caller gets its own copy of the parsed value."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Dict, Tuple, TypeVar

T = TypeVar("T")
PARSED: Dict[Tuple[Any, str, int, int], Any] = {}


def parsed(path: Path, parse: Callable[[Path], T]) -> T:
    """``parse(path)``, once per version of the file; a copy returned. A file that fails to parse raises each time."""
    stat = path.stat()
    key = (parse, str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in PARSED:
        PARSED[key] = parse(path)
    return copy.deepcopy(PARSED[key])
