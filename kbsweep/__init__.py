"""kbsweep: sweeps LLM agents over GPU-kernel problems and scores their kernels against the roofline.

Pipeline, one module per stage: config → matrix (cells) → launch → agent → grader → audit → score → tracking/report.
The package root is the public face: the error kinds and exit codes (:mod:`kbsweep.errors`), the checkout's root
(:mod:`kbsweep.paths`) and the Python API (:mod:`kbsweep.api`). kbsweep's own modules import those leaves, never the
root, so that the root may import the API without an import circle.

``kbsweep.report`` is the API's function even after the leaderboard module of that name is imported: that module is
reached by its full name (``from kbsweep.report import build_boards``), never as an attribute of the package.
"""
import sys
import types

from kbsweep.errors import ExitCode, InfraError, KbsweepError
from kbsweep.paths import REPO_ROOT

__version__ = "0.1.0"
API = ("plan", "run", "grade", "report")
__all__ = ["ExitCode", "InfraError", "KbsweepError", "REPO_ROOT", *API]


class Package(types.ModuleType):
    """The package's module type: Python binds a submodule, once imported, as an attribute of its package; a
    submodule named like an API function (``kbsweep/report.py``) would replace the function."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in API and isinstance(value, types.ModuleType):
            return  # the submodule stays in sys.modules, under its full name
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = Package


def __getattr__(name: str):
    """``kbsweep.plan/run/grade/report``: the Python API (:mod:`kbsweep.api`), imported on first use."""
    if name in API:
        from kbsweep import api

        return getattr(api, name)
    raise AttributeError(f"module 'kbsweep' has no attribute {name!r}")
