"""scripts/check.sh, the checks CI runs before the tests: on a copy of its script and of pyproject.toml beside a
one-module ``kbsweep`` package, a clean tree passes with one line per tool, and a lint finding, a file ruff would
reformat and a type error each fail it (exit 1) on their tool's line, with the finding printed under it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
VENV = Path(sys.executable).parent.parent
CLEAN = "def double(x: int) -> int:\n    return 2 * x\n"


def tree(folder: Path, module: str) -> Path:
    (folder / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "check.sh", folder / "scripts" / "check.sh")
    shutil.copy(REPO / "pyproject.toml", folder / "pyproject.toml")
    (folder / "kbsweep").mkdir()
    (folder / "kbsweep" / "__init__.py").write_text(module)
    return folder


def check(folder: Path) -> subprocess.CompletedProcess:
    if not (VENV / "bin" / "ruff").exists() or not (VENV / "bin" / "mypy").exists():
        pytest.skip("this venv lacks the test extra's ruff and mypy")
    return subprocess.run(
        ["bash", str(folder / "scripts" / "check.sh")],
        env={"PATH": "/usr/bin:/bin", "VENV": str(VENV)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_clean_tree_passes_with_one_line_per_tool(tmp_path):
    proc = check(tree(tmp_path, CLEAN))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(": ")[0] for line in lines] == ["ruff check", "ruff format", "mypy"]
    assert all(": ok (" in line for line in lines), lines


FINDINGS = {
    "ruff check": ("import os\n", "F401"),  # imported and unused
    "ruff format": ("def double(x: int) -> int:\n    return  2 * x\n", "kbsweep/__init__.py"),  # the double space
    "mypy": ('NAME: int = "x"\n', "Incompatible types in assignment"),
}


@pytest.mark.parametrize("tool", list(FINDINGS))
def test_each_kind_of_finding_fails_it_on_its_tools_line_alone(tool, tmp_path):
    module, finding = FINDINGS[tool]
    proc = check(tree(tmp_path, module))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [line.split(": ")[0] for line in proc.stdout.splitlines() if ": FAILED" in line]
    assert failed == [tool] and finding in proc.stdout, proc.stdout


def test_every_tool_runs_when_the_first_fails(tmp_path):
    proc = check(tree(tmp_path, "".join(module for module, _ in FINDINGS.values())))
    assert proc.returncode == 1
    summary = [line for line in proc.stdout.splitlines() if not line.startswith(" ")]
    assert [line.split(": FAILED")[0] for line in summary] == list(FINDINGS), proc.stdout
    assert all(finding in proc.stdout for _, finding in FINDINGS.values()), proc.stdout
