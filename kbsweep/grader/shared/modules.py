"""A Python file loaded as a module by path: the referee's reference and baselines, the ncu driver's reference."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_module(name: str, path: Path) -> ModuleType:
    """``path`` executed as module ``name`` (registered in ``sys.modules`` first, as an import would); ImportError
    where ``path`` is no Python source (no loader takes its suffix)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be loaded as a Python module", name=name, path=str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
