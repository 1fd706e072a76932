"""kbsweep: sweeps LLM agents over GPU-kernel problems and scores their kernels against the roofline.

Pipeline, one module per stage: config → matrix (cells) → launch → agent → grader → audit → score → tracking/report.
The package root is the public face: the error kinds and exit codes (:mod:`kbsweep.errors`), the checkout's root
(:mod:`kbsweep.paths`) and the Python API (:mod:`kbsweep.api`). kbsweep's own modules import those leaves, never the
root, so that the root may import the API without an import circle.
"""
from kbsweep.errors import ExitCode, InfraError, KbsweepError
from kbsweep.paths import REPO_ROOT

__version__ = "0.1.0"
__all__ = ["ExitCode", "InfraError", "KbsweepError", "REPO_ROOT", "plan", "run", "grade", "report"]


def __getattr__(name: str):
    """``kbsweep.plan/run/grade/report``: the Python API (:mod:`kbsweep.api`), imported on first use."""
    if name in ("plan", "run", "grade", "report"):
        from kbsweep import api

        return getattr(api, name)
    raise AttributeError(f"module 'kbsweep' has no attribute {name!r}")
