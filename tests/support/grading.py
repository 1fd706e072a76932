"""Grading from tests: one grade's stored record (what cells, the CLI and the audit read), on this machine's CPU."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict

from kbsweep.grader import grade
from kbsweep.grader.request import GradeRequest

CPU = SimpleNamespace(name="cpu", device="cpu", shape_set="smoke_shapes")


def graded(*args: Any, **settings: Any) -> Dict[str, Any]:
    """``grade(GradeRequest(*args, **settings))``, as stored (JSON)."""
    return grade(GradeRequest(*args, **settings)).to_json()
