"""kbsweep: sweeps LLM agents over GPU-kernel problems and scores their kernels against the roofline.

Pipeline, one module per stage: config → matrix (cells) → launch → agent → grader → audit → score → tracking/report.
"""
from enum import IntEnum
from pathlib import Path

__version__ = "0.1.0"

REPO_ROOT = Path(__file__).resolve().parent.parent


class KbsweepError(Exception):
    """An error the user can fix; printed as one line, never as a traceback."""


class InfraError(Exception):
    """Infrastructure failed (a scheduler refused a job, say): printed as one line, exit code INFRA; a rerun retries."""


class ExitCode(IntEnum):
    """What ``kbsweep`` exits with (README, "Exit codes")."""

    OK = 0
    BUG = 1  # an unexpected error, with its traceback: a bug to report
    CONFIG = 2  # a config, problem or input error: one line naming the file and key; nothing was launched
    MODEL = 3  # the model's failure: `grade` of an incorrect, crashing, too slow or too hungry solution
    INFRA = 4  # infrastructure: provider, node or scheduler faults, cells left unfinished; a rerun resumes


def __getattr__(name: str):
    """``kbsweep.plan/run/grade/report``: the Python API (:mod:`kbsweep.api`), imported on first use."""
    if name in ("plan", "run", "grade", "report"):
        from kbsweep import api

        return getattr(api, name)
    raise AttributeError(f"module 'kbsweep' has no attribute {name!r}")
