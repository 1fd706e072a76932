"""Grading from tests: one grade's stored record (what cells, the CLI and the audit read), on this machine's CPU."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict

from kbsweep.config.schema import load_gpu
from kbsweep.grader import grade
from kbsweep.grader.request import GradeRequest

CPU = load_gpu("cpu")  # conf/gpu/cpu.yaml: smoke shapes on the CPU
# the runner zygote's home for this test process's grades: they fork from one warm zygote as a sweep's cells do
# (under each grade's own log folder, every test would start its own, importing torch again)
ZYGOTE_HOME = Path(tempfile.mkdtemp(prefix="kbsweep-test-zygotes-"))
atexit.register(shutil.rmtree, ZYGOTE_HOME, ignore_errors=True)


def graded(*args: Any, **settings: Any) -> Dict[str, Any]:
    """``grade(GradeRequest(*args, **settings))``, as stored (JSON); the runner zygote's home shared unless given."""
    settings.setdefault("zygote_home", ZYGOTE_HOME)
    return grade(GradeRequest(*args, **settings)).to_json()
