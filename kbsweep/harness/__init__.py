"""Agent harnesses: who drives the model through a cell (docs/harnesses.md).

A runner gets an :class:`AgentJob` (the sandboxed workspace, the prompt, the budgets, the model YAML, the check
tool, the transcript) and returns the loop's :class:`~kbsweep.agent.loop.AgentResult` (stop reason, turns, usage,
dollars, provider fault); the cell grades whatever ``solution.py`` the workspace holds afterwards. Runners are
registered by name; a harness YAML (``conf/harness/<name>.yaml``) picks one with ``runner:``. Adding a harness is
one YAML and one :class:`Runner` subclass decorated with :func:`register`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Dict, Mapping, Type

from kbsweep import KbsweepError
from kbsweep.agent.loop import AgentResult, Budgets
from kbsweep.agent.tools import Toolbox
from kbsweep.agent.transcript import Transcript


@dataclass
class AgentJob:
    """Everything a runner may use for one cell."""

    workspace: Path  # holds the problem's public files; the answer is solution.py in it
    prompt: str  # the problem's prompt with the GPU's description
    budgets: Budgets
    model: Dict[str, Any]  # the resolved model YAML (its route, key variable, prices)
    toolbox: Toolbox  # the built-in loop's tools: its check and benchmark are the check tool of every harness
    transcript: Transcript  # kbsweep's event schema (docs/transcripts.md)
    folder: Path  # the cell's folder, for a harness's own artifacts
    solutions: Dict[str, Path]  # bundled solutions, which scripted models may play


class Runner:
    """One harness. ``conf`` is its resolved YAML (kbsweep.config.HarnessConf)."""

    name: ClassVar[str]

    def __init__(self, conf: Mapping[str, Any]):
        self.conf = dict(conf)

    def preflight(self, model: Mapping[str, Any]) -> None:
        """Raise a one-line KbsweepError when this harness cannot run ``model`` here (before any cell runs)."""

    def describe(self) -> str:
        """One line for ``kbsweep plan``: the harness and what it runs."""
        return self.conf["name"]

    def run(self, job: AgentJob) -> AgentResult:
        raise NotImplementedError


RUNNERS: Dict[str, Type[Runner]] = {}


def register(cls: Type[Runner]) -> Type[Runner]:
    RUNNERS[cls.name] = cls
    return cls


def runner_for(conf: Mapping[str, Any]) -> Runner:
    """The runner a harness YAML names."""
    if conf["runner"] not in RUNNERS:
        raise KbsweepError(
            f"harness/{conf['name']}.yaml: key 'runner': unknown runner '{conf['runner']}' ({', '.join(sorted(RUNNERS))})"
        )
    return RUNNERS[conf["runner"]](conf)


from kbsweep.harness import builtin, claude_code, codex  # noqa: E402,F401  (each registers its runner)
