"""Grading from tests: one grade's stored record (what cells, the CLI and the audit read), on this machine's CPU."""
from __future__ import annotations

from typing import Any, Dict

from kbsweep.config import load_gpu
from kbsweep.grader import grade
from kbsweep.grader.request import GradeRequest

CPU = load_gpu("cpu")  # conf/gpu/cpu.yaml: smoke shapes on the CPU


def graded(*args: Any, **settings: Any) -> Dict[str, Any]:
    """``grade(GradeRequest(*args, **settings))``, as stored (JSON)."""
    return grade(GradeRequest(*args, **settings)).to_json()
