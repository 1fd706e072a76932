"""Where a CLI harness is installed and what its sandbox must hold to run it.

A harness's ``bin`` is looked up in the install folder's ``node_modules/.bin`` (``.harnesses/``), then on PATH.
Either way the name is usually a symlink (npm's ``bin/codex -> ../lib/node_modules/@openai/codex/bin/codex.js``)
to a script run by an interpreter (``#!/usr/bin/env node``) that may live outside the system folders the sandbox
mounts (a user's npm prefix, nvm). :func:`locate` follows the links and the shebang: the CLI is started as
``[interpreter, *its arguments, script]`` (or the native binary itself), and the sandbox binds read-only the
outermost ``node_modules`` holding the script (its package and the dependencies it loads, e.g. Codex's platform
binary) and the interpreter's folder.
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Tuple

from kbsweep.errors import KbsweepError
from kbsweep.paths import REPO_ROOT


def install_dir() -> Path:
    """Where `python -m kbsweep.harness.install` puts the pinned packages."""
    return REPO_ROOT / ".harnesses"


@dataclass(frozen=True)
class Installed:
    """A located CLI: ``found`` (the path the lookup gave), ``argv`` (how to start it), ``mounts`` (folders the
    sandbox binds read-only for it) and ``path`` (folders for the end of its PATH: the interpreter's, for what the
    CLI itself starts with ``env node``; at the end, so the sandbox's Python stays the shell's ``python``)."""

    found: Path
    argv: Tuple[str, ...]
    mounts: Tuple[Path, ...]
    path: Tuple[str, ...]


def shebang(script: Path) -> Tuple[str, ...]:
    """The interpreter command of a ``#!`` script (``env`` and ``env -S`` resolved to what they run), else ()."""
    with script.open("rb") as fh:
        head = fh.readline(512)
    if not head.startswith(b"#!"):
        return ()
    words = shlex.split(head[2:].decode(errors="replace"))
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if w != "-S"]
    return tuple(words)


def package_root(target: Path) -> Path:
    """The outermost ``node_modules`` above ``target`` (its package and the dependencies npm hoisted beside it),
    else ``target``'s folder (a standalone binary)."""
    for parent in reversed(target.parents):
        if parent.name == "node_modules":
            return parent
    return target.parent


def locate(conf: Mapping[str, str]) -> Installed:
    """The CLI a harness YAML names (``bin``), resolved as the module docstring says; refuses in one line."""
    where = f"harness/{conf['name']}.yaml"
    installed = install_dir() / "node_modules" / ".bin" / conf["bin"]
    found = installed if installed.exists() else shutil.which(conf["bin"])
    if not found:
        raise KbsweepError(
            f"{where}: key 'bin': '{conf['bin']}' is not installed; run "
            f"`python -m kbsweep.harness.install` (npm {conf['package']}@{conf['version']})"
        )
    target = Path(found).resolve()
    command = shebang(target)
    if not command:
        return Installed(Path(found), (str(target),), (package_root(target),), ())
    on_path = shutil.which(command[0])
    if not on_path:
        raise KbsweepError(f"{where}: key 'bin': {target} runs '{command[0]}', which is not on PATH")
    interpreter = Path(on_path).resolve()
    return Installed(
        Path(found),
        (str(interpreter), *command[1:], str(target)),
        (package_root(target), interpreter.parent),
        (str(interpreter.parent),),
    )
