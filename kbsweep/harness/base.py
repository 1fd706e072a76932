"""The harness interface: the job a runner gets, the :class:`Runner` base class and the registry of runners by
name (``harness.runner``). The runners themselves are the package's other modules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Dict, Mapping, Type

from kbsweep.agent.loop import AgentResult, Budgets
from kbsweep.agent.tools import Toolbox, tool_names
from kbsweep.agent.transcript import Transcript
from kbsweep.registry import Registry


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
    """One harness. ``conf`` is its resolved YAML (kbsweep.config.schema.HarnessConf)."""

    name: ClassVar[str]

    def __init__(self, conf: Mapping[str, Any]):
        self.conf = dict(conf)

    def preflight(self, model: Mapping[str, Any]) -> None:
        """Raise a one-line KbsweepError when this harness cannot run ``model`` here (before any cell runs)."""

    def describe(self) -> str:
        """One line for ``kbsweep plan``: the harness and what it runs."""
        return self.conf["name"]

    def setup(self, allow_shell: bool) -> Dict[str, str]:
        """What the model works with beside the problem's prompt and the track's budgets, which every harness gets
        alike: logged with each cell (``setup.*`` params), and the report lists where a harness differs from the
        built-in loop's (this one)."""
        return {
            "tools": ",".join(tool_names(allow_shell)),
            "kbsweep_tools": "function calls",
            "shell": "run_shell, in kbsweep's sandbox" if allow_shell else "none",
            "instructions": "kbsweep's system prompt, then the problem's prompt",
            "ends": "submit, or a turn without tool calls",
            "budgets_checked": "before each model call, by the loop",
        }

    def run(self, job: AgentJob) -> AgentResult:
        raise NotImplementedError


RUNNERS: Registry[Type[Runner]] = Registry("harness.runner")


def register(cls: Type[Runner]) -> Type[Runner]:
    """Class decorator: the runner under its ``name``."""
    return RUNNERS.register(cls.name)(cls)


def runner_for(conf: Mapping[str, Any]) -> Runner:
    """The runner a harness YAML names."""
    return RUNNERS.lookup(conf["runner"], f"harness/{conf['name']}.yaml")(conf)
