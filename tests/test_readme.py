"""Every command of the README's code blocks, run as written from a fresh folder that holds the checkout's
``problems/`` (the README's commands run from the checkout's root; their outputs land in the fresh folder): those
that need nothing this machine lacks run for real; a sweep too long for a test runs as `kbsweep plan` with the same
arguments (the same parsing, config composition and matrix); those that need a GPU, keys, npm or a server run to
their clean failure (one line, exit code 2) or are skipped with the reason below. A README command missing from
COMMANDS fails. Every file a command or Python block names exists, and each Python block runs as pasted."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SLOW = "a sweep of many CPU cells takes minutes: run as `kbsweep plan` with the same arguments"
# command → ("run", exit codes, text expected in stdout+stderr) | ("plan", reason) | ("skip", reason)
COMMANDS = {
    "python3 -m venv .venv && .venv/bin/pip install -e '.[cpu]' && .venv/bin/kbsweep": (
        "skip",
        "installs a venv (scripts/test.sh does; the default sweep runs below as `kbsweep --force`)",
    ),
    "bash scripts/test.sh": ("skip", "runs this whole test suite"),
    ".venv/bin/pip install -e '.[cpu,test]'": ("skip", "installs packages (scripts/test.sh does)"),
    ".venv/bin/python -m pytest -m fast": ("skip", "runs this suite's fast tier"),
    "bash scripts/check.sh": (
        "skip",
        "checks the checkout itself, not a fresh folder (tests/test_check_script.py runs it)",
    ),
    ".venv/bin/pip install pre-commit && .venv/bin/pre-commit install": (
        "skip",
        "installs a package from PyPI and a git hook into the checkout",
    ),
    ".venv/bin/python -m pytest tests/test_launch.py": ("skip", "runs tests/test_launch.py"),
    ". .venv/bin/activate": (
        "skip",
        "a shell builtin: these commands run with the venv first on PATH instead (tests/test_first_hour.py runs this line)",
    ),
    "kbsweep -m model=opus-4.8,glm-5.2 gpu=h100 track=mega": ("run", {2}, "needs 1 GPU(s); this machine offers 0"),
    "kbsweep -m model=scripted,scripted-lazy repeat=0,1,2": ("plan", SLOW),
    "python -m kbsweep.harness.install": ("skip", "installs the CLI harnesses from npm (needs the network)"),
    "kbsweep -m harness=builtin,claude-code,codex model=opus-4.8 track=hard": (
        "run",
        {2},
        "kbsweep: error:",
    ),  # the CLIs, else the key
    "kbsweep track=hard problem=topk,kda -m": ("plan", SLOW),
    "kbsweep plan -m model=opus-4.8,glm-5.2 track=hard": ("run", {0}, "missing key: model 'glm-5.2'"),
    "kbsweep plan --json -m model=opus-4.8 track=hard": ("run", {0}, '"expected_tokens": {'),
    "kbsweep preflight -m model=opus-4.8,glm-5.2": ("run", {2}, "environment variable ZAI_API_KEY is not set"),
    "kbsweep grade problem=demo/scale_shift solution=problems/demo/scale_shift/solutions/triton.py gpu=cpu": (
        "run",
        {0},
        '"outcome": "pass"',
    ),
    "kbsweep grade --mode profile problem=demo/scale_shift solution=problems/demo/scale_shift/solutions/triton.py gpu=cpu": (
        "run",
        {0},
        "CPU: interpreter/op view, not GPU kernels",
    ),
    "kbsweep report": ("run", {0}, ""),
    "kbsweep export +out=hf-dataset": ("run", {0}, "exported 0 runs"),
    "kbsweep calibrate gpu=h200": ("skip", "measures an H200's peaks (needs the GPU)"),
    "kbsweep audit": ("run", {0}, ""),
    "kbsweep regrade gpu=h200 track=hard": (
        "run",
        {2},
        "no GPU is visible here; use gpu=cpu",
    ),  # tests/test_regrade.py regrades one
    'kbsweep audit override <run_id> --verdict clean --reason "..."': ("run", {2}, "kbsweep: error:"),
    "kbsweep --force": ("plan", SLOW),
    "kbsweep launcher=slurm launcher.slurm.partition=gpu -m model=...": ("run", {2}, "Could not find 'model/...'"),
    "kbsweep tracking=server tracking.uri=http://127.0.0.1:5000": (
        "skip",
        "needs a running MLflow server (tests/test_tracking_server.py sweeps into one)",
    ),
    "mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db": (
        "skip",
        "a long-running server (tests/test_browser_mlflow_ui.py drives one)",
    ),
}


def readme_blocks(language: str) -> list:
    return re.findall(rf"```{language}\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def readme_commands() -> list:
    return [
        line.split("  #")[0].strip() for block in readme_blocks("bash") for line in block.splitlines() if line.strip()
    ]


def checkout_like(folder: Path) -> Path:
    """``folder`` as the README's commands find the checkout's root: its ``problems/`` (a link), nothing else."""
    (folder / "problems").symlink_to(REPO / "problems")
    return folder


def readme_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "KBSWEEP_OUTPUTS"}
    env["PATH"] = f"{BIN}:{env['PATH']}"
    env["CUDA_VISIBLE_DEVICES"] = (
        ""  # the same answers on a machine with GPUs: a GPU cell is refused before its keys are asked for
    )
    return env


@pytest.mark.fast
def test_every_readme_command_is_covered():
    assert set(readme_commands()) == set(COMMANDS)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_readme_command(command, tmp_path):
    mode, *rest = COMMANDS[command]
    if mode == "skip":
        pytest.skip(rest[0])
    words = shlex.split(command.replace("<run_id>", "0123456789abcdef"))
    if mode == "plan":
        words.insert(1, "plan")
    proc = subprocess.run(
        words, cwd=checkout_like(tmp_path), env=readme_env(), capture_output=True, text=True, timeout=600
    )
    output = proc.stdout + proc.stderr
    codes, expected = rest if mode == "run" else ({0}, "cells; model spend")
    assert proc.returncode in codes and expected in output, output[-3000:]
    if proc.returncode == 2:  # a clean failure: one-line errors, no traceback
        assert "Traceback" not in output


PATHLIKE = re.compile(r"(?<![\w./-])((?:\.venv/bin/|scripts/|tests/|problems/|conf/|docs/|kbsweep/)[\w./-]*[\w/])")


@pytest.mark.fast
def test_every_file_a_readme_block_names_exists():
    """Each checkout path a command or Python block names (a script, a test file, a bundled solution) is there; the
    virtual environment's own (``.venv/bin/...``) are made by the README's first line, so only named here."""
    named = {
        m
        for block in readme_blocks("bash") + readme_blocks("python")
        for line in block.splitlines()
        for m in PATHLIKE.findall(line.split("  #")[0])
    }
    assert named, "no path found: the pattern no longer reads the README"
    missing = sorted(p for p in named if not p.startswith(".venv/") and not (REPO / p).exists())
    assert not missing, f"README blocks name paths that do not exist: {missing}"


@pytest.mark.parametrize("index", range(len(readme_blocks("python"))))
def test_readme_python_block_runs_as_pasted(index, tmp_path):
    """The block, as pasted, in a fresh interpreter from a fresh folder (the checkout's ``problems/`` in it, no API
    keys): it raises nothing and each name it binds but ``kbsweep`` is one of the API's records."""
    block = readme_blocks("python")[index]
    probe = (
        f"exec(compile({block!r}, 'README.md', 'exec'))\n"
        "import dataclasses, json\n"
        "print(json.dumps({k: dataclasses.is_dataclass(v) for k, v in dict(globals()).items() "
        "if not k.startswith('_') and k not in ('kbsweep', 'dataclasses', 'json')}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=checkout_like(tmp_path),
        env=readme_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    bound = json.loads(proc.stdout.strip().splitlines()[-1])
    assert bound and all(bound.values()), bound
