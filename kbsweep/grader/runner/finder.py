"""How the runner finds the candidate's files: its folder as the package ``kbsweep_candidate``. A module of its own:
the finder sits on ``sys.meta_path``, where the candidate reads it, and its methods' globals are this module's,
never the runner's."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
from pathlib import Path

PACKAGE = "kbsweep_candidate"


class CandidateFinder(importlib.abc.MetaPathFinder):
    """The candidate's folder as the package ``kbsweep_candidate``; a top-level import nothing else resolves (a
    helper module such as ``import _kernels``) falls through to a file of that folder."""

    def __init__(self, folder: Path):
        self.folder = folder

    def find_spec(self, name, path, target=None):
        if name == PACKAGE:
            spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
            spec.submodule_search_locations = [str(self.folder)]
            return spec
        if path is not None or "." in name:
            return None
        for candidate in (self.folder / f"{name}.py", self.folder / name / "__init__.py"):
            if candidate.is_file():
                return importlib.util.spec_from_file_location(name, candidate)
        return None
