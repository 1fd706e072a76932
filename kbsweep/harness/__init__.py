"""Agent harnesses: who drives the model through a cell (docs/harnesses.md).

A runner gets an :class:`AgentJob` (the sandboxed workspace, the prompt, the budgets, the model YAML, the check
tool, the transcript) and returns the loop's :class:`~kbsweep.agent.loop.AgentResult` (stop reason, turns, usage,
dollars, provider fault); the cell grades whatever ``solution.py`` the workspace holds afterwards. Runners are
registered by name; a harness YAML (``conf/harness/<name>.yaml``) picks one with ``runner:``. Adding a harness is
one YAML and one :class:`Runner` subclass decorated with :func:`register`, in a module imported here.

Rank 5 of the layout (docs/architecture.md; the ranks live in tests/test_layout.py): imports agent and the
stages below it.
"""

from __future__ import annotations

from kbsweep.harness import builtin, claude_code, codex  # noqa: F401  (each registers its runner)
from kbsweep.harness.base import RUNNERS, AgentJob, Runner, register, runner_for

__all__ = ["RUNNERS", "AgentJob", "Runner", "register", "runner_for"]
