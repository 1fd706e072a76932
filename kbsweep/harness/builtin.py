"""kbsweep's own tool-calling loop (kbsweep/agent/loop.py) as a runner."""

from __future__ import annotations

from kbsweep.agent.loop import AgentResult, run_agent
from kbsweep.agent.providers import build_model
from kbsweep.harness.base import AgentJob, Runner, register


@register
class BuiltinRunner(Runner):
    name = "builtin"

    def run(self, job: AgentJob) -> AgentResult:
        model = build_model(job.model, job.solutions)
        return run_agent(model, job.prompt, job.toolbox, job.budgets, job.transcript, job.model["context_window"])
