"""A Python file loaded as a module by path: the referee's reference and baselines, the ncu driver's reference."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_module(name: str, path: Path):
    """``path`` executed as module ``name`` (registered in ``sys.modules`` first, as an import would)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
