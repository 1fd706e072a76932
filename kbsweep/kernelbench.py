"""Stanford KernelBench single-file problems (`Model`, `get_inputs()`, `get_init_inputs()`, module-level sizes)
as kbsweep problems, so existing KernelBench decks run through the same grader and tracking.

Each file becomes a problem folder in a cache: the original file as the public `reference.py` and a small
adapter that gives the grader kbsweep's reference contract. There are no FLOP/byte formulas, so the score is
the speedup over the eager reference (``basis: speedup``), and reports say so.
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import List

from kbsweep import KbsweepError

ADAPTER = '''"""Adapter: kbsweep's reference contract over a KernelBench file (generated)."""
import importlib.util

import torch

_spec = importlib.util.spec_from_file_location("kernelbench_original", {original!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
Model = _module.Model


def get_init_inputs(shape):
    return list(_module.get_init_inputs())


def get_inputs(shape, device):
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in _module.get_inputs()]
'''

PROBLEM_YAML = """name: {name}
display_name: "KernelBench {name}"
regime: compute
tolerance:
  float32: {{atol: 1.0e-2, rtol: 1.0e-2}}   # KernelBench's own default (atol = rtol = 1e-2)
  float16: {{atol: 1.0e-2, rtol: 1.0e-2}}
  bfloat16: {{atol: 1.0e-2, rtol: 1.0e-2}}
shapes: [{{}}]        # sizes are the file's module-level constants
smoke_shapes: [{{}}]
seeds: 3
score: speedup
"""


def kernelbench_names(folder: Path) -> List[str]:
    return sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_"))


def materialize(folder: Path, name: str) -> Path:
    """The kbsweep problem folder for ``folder/<name>.py`` (rebuilt when the file changes)."""
    original = folder / f"{name}.py"
    if not original.is_file():
        raise KbsweepError(f"unknown KernelBench problem '{name}' in {folder}")
    digest = hashlib.sha256(original.read_bytes()).hexdigest()[:12]
    root = Path(tempfile.gettempdir()) / "kbsweep-kernelbench" / digest / name
    if not (root / "problem.yaml").exists():
        root.mkdir(parents=True, exist_ok=True)
        shutil.copy2(original, root / "reference.py")
        (root / "kbsweep_adapter.py").write_text(ADAPTER.format(original=str(root / "reference.py")))
        solutions = folder / "solutions" / name
        if solutions.is_dir():
            shutil.copytree(solutions, root / "solutions", dirs_exist_ok=True)
        (root / "problem.yaml").write_text(PROBLEM_YAML.format(name=name))
    return root
