"""How a grade fails: the exception that carries an outcome, and the classification of candidate exceptions."""

from __future__ import annotations

import errno
import resource

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
    if isinstance(exc, (SyntaxError, ImportError)) or type(exc).__name__ in (
        "CompilationError",
        "CompileTimeAssertionFailure",
    ):
        return Outcome.COMPILE_ERROR
    return Outcome.RUNTIME_ERROR


def one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        return file_cap(exc)
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:500] if text else type(exc).__name__


def file_cap(exc: OSError) -> str:
    """EFBIG named for what it almost always is in a grade: the sandbox's cap on any one file (``ulimit -f``, set
    from ``sandbox.disk_mib``), read back from this process's own limit. A write's OSError carries no path."""
    cap = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    what = f"writing {exc.filename}" if exc.filename else "writing a file"
    if cap == resource.RLIM_INFINITY:  # no rlimit: the file system's own maximum
        return f"file too large for its file system, {what} (OSError: {exc.strerror})"
    return f"file size cap of {cap} bytes ({cap / 2**20:g} MiB, sandbox.disk_mib) reached {what}"
