"""kbsweep: sweeps LLM agents over GPU-kernel problems and scores their kernels against the roofline.

The pipeline, one package per stage (docs/architecture.md), from the bottom of the import order up:

* records, at the top level: :mod:`~kbsweep.errors` (error kinds, exit codes), :mod:`~kbsweep.paths` (the
  checkout's root), :mod:`~kbsweep.outcomes`, :mod:`~kbsweep.registry` (name -> implementation);
* :mod:`kbsweep.config`: what a sweep is asked for and what it names (schemas, GPUs, problems);
* :mod:`kbsweep.score`: a grade's figures over the roofline;
* :mod:`kbsweep.sandbox`: confinement of commands and grading processes;
* :mod:`kbsweep.agent`: the tool-calling loop, models, transcripts;
* :mod:`kbsweep.harness`: who drives the model through a cell;
* :mod:`kbsweep.grader`: one grade, a trusted referee and the candidate's runner (``referee/``, ``runner/``,
  ``shared/``);
* :mod:`kbsweep.planner`: configs -> cells; :mod:`kbsweep.tracking`: the MLflow store; :mod:`kbsweep.audit`:
  findings and verdicts;
* :mod:`kbsweep.cell`: one cell end to end; :mod:`kbsweep.launch`: cells to executors, the sweep, regrades;
  :mod:`kbsweep.reporting`: boards, renders, plots, the export;
* the entry points: :mod:`kbsweep.cli`, :mod:`kbsweep.api` (and :mod:`kbsweep.compose`, the config preparation
  both share).

A module imports its own stage and the ones listed before it, never one after (tests/test_layout.py). The package
root is the public face: the error kinds and exit codes, the checkout's root and the Python API
(``kbsweep.plan/run/grade/report``, from :mod:`kbsweep.api` on first use). kbsweep's own modules import the
records, never the root, so that the root may import the API without an import circle; no top-level module is
named like an API function, so each of those names stays the function.
"""

from kbsweep.errors import ExitCode, InfraError, KbsweepError
from kbsweep.paths import REPO_ROOT

__version__ = "0.1.0"
API = ("plan", "run", "grade", "report")
__all__ = ["ExitCode", "InfraError", "KbsweepError", "REPO_ROOT", *API]


def __getattr__(name: str):
    """``kbsweep.plan/run/grade/report``: the Python API (:mod:`kbsweep.api`), imported on first use."""
    if name in API:
        from kbsweep import api

        return getattr(api, name)
    raise AttributeError(f"module 'kbsweep' has no attribute {name!r}")
