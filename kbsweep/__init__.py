"""kbsweep: sweeps LLM agents over GPU-kernel problems and scores their kernels against the roofline.

Pipeline, one module per stage: config → matrix (cells) → launch → agent → grader → audit → score → tracking/report.
"""
from pathlib import Path

__version__ = "0.1.0"

REPO_ROOT = Path(__file__).resolve().parent.parent


class KbsweepError(Exception):
    """An error the user can fix; printed as one line, never as a traceback."""
