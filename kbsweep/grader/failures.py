"""How a grade fails: the exception that carries an outcome, and the classification of candidate exceptions."""
from __future__ import annotations

from kbsweep.outcomes import Outcome

COMM_FINDINGS = ("c10d_collective", "nccl_kernel")  # dynamic findings that disqualify a multi-GPU candidate


class GradeFailure(Exception):
    def __init__(self, outcome: Outcome, message: str):
        super().__init__(message)
        self.outcome = outcome


def classify(exc: BaseException) -> Outcome:
    """Outcome of an exception raised by candidate code."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return Outcome.GRADE_OOM
    if isinstance(exc, (SyntaxError, ImportError)) or type(exc).__name__ in ("CompilationError", "CompileTimeAssertionFailure"):
        return Outcome.COMPILE_ERROR
    return Outcome.RUNTIME_ERROR


def one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:500] if text else type(exc).__name__
