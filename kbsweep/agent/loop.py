"""The agent loop: prompt → model turn → tool calls → results, until submit, stop, or a budget ends.

Context rule: before each call, if the conversation's estimated size (characters / 4) exceeds 75% of the
model's context window, the oldest tool results (all but the last 4) are replaced by a one-line stub that
keeps their first 200 characters; on a context-overflow error the rule is applied again to all but the
last 2, once per turn.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from kbsweep.agent.models import ChatModel, ProviderFault, Usage
from kbsweep.agent.tools import Toolbox
from kbsweep.agent.transcript import Transcript
from kbsweep.outcomes import Outcome, StopReason

SYSTEM_PROMPT = (
    "You are a GPU kernel engineer. Work only through the tools. Your answer is the file solution.py in the "
    "workspace; check it with run_check, time it with run_benchmark, and call submit when done."
)
CONTEXT_FILL = 0.75


@dataclass
class Budgets:
    wall_s: float = 10_800.0
    max_turns: int = 200
    max_tokens: Optional[int] = None
    max_usd: Optional[float] = None


@dataclass
class AgentResult:
    stop_reason: StopReason
    turns: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    wall_s: float = 0.0
    fault: Optional[Dict[str, str]] = None  # {"outcome", "message"} for provider faults
    steps: List[Dict[str, Any]] = field(default_factory=list)  # best score so far per graded turn


def estimate_tokens(messages: List[Dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or "")) for m in messages) // 4


def shorten_context(messages: List[Dict[str, Any]], keep_last: int) -> int:
    """Stub out older tool results; returns how many were shortened."""
    tool_indices = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    shortened = 0
    for i in tool_indices[:-keep_last] if keep_last else tool_indices:
        content = messages[i]["content"]
        if not content.startswith("[shortened"):
            messages[i]["content"] = f"[shortened: {len(content)} characters] {content[:200]}"
            shortened += 1
    return shortened


def budget_stop(result: AgentResult, budgets: Budgets, started: float) -> Optional[StopReason]:
    if time.monotonic() - started > budgets.wall_s:
        return StopReason.WALL_CLOCK
    if result.turns >= budgets.max_turns:
        return StopReason.MAX_TURNS
    if budgets.max_tokens is not None and result.usage.total >= budgets.max_tokens:
        return StopReason.TOKEN_BUDGET
    if budgets.max_usd is not None and result.cost_usd >= budgets.max_usd:
        return StopReason.DOLLAR_BUDGET
    return None


def call_model(model: ChatModel, messages, tools, context_window: int, transcript: Transcript):
    """One model call, shortening the context on overflow (once)."""
    if estimate_tokens(messages) > CONTEXT_FILL * context_window:
        transcript.add("compaction", shortened=shorten_context(messages, keep_last=4))
    try:
        return model.complete(messages, tools)
    except ProviderFault as fault:
        if type(fault).__name__ != "ContextOverflow":
            raise
        transcript.add("compaction", shortened=shorten_context(messages, keep_last=2), reason=str(fault))
        return model.complete(messages, tools)


def run_agent(
    model: ChatModel,
    prompt: str,
    toolbox: Toolbox,
    budgets: Budgets,
    transcript: Transcript,
    context_window: int = 200_000,
) -> AgentResult:
    """Run until the model submits or stops, a budget ends, or the provider fails for good."""
    messages: List[Dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": prompt},
    ]
    for message in messages:
        transcript.add(message["role"], content=message["content"])
    tools = toolbox.schemas()
    result = AgentResult(stop_reason=StopReason.MODEL_STOPPED)
    started = time.monotonic()
    best: Optional[float] = None
    while True:
        stop = budget_stop(result, budgets, started)
        if stop:
            result.stop_reason = stop
            break
        try:
            completion = call_model(model, messages, tools, context_window, transcript)
        except ProviderFault as fault:
            result.stop_reason = StopReason.PROVIDER_FAULT
            result.fault = {"outcome": fault.outcome.value, "message": str(fault)}
            transcript.add("error", outcome=fault.outcome.value, message=str(fault))
            break
        result.turns += 1
        result.usage.add(completion.usage)
        result.cost_usd += completion.cost_usd
        message = completion.message
        messages.append(message)
        transcript.add(
            "assistant",
            content=message.get("content"),
            tool_calls=message.get("tool_calls") or [],
            reasoning=completion.reasoning,
            usage=vars(completion.usage),
            cost_usd=completion.cost_usd,
            latency_s=completion.latency_s,
            finish_reason=completion.finish_reason,
        )
        calls = message.get("tool_calls") or []
        if not calls:
            result.stop_reason = StopReason.MODEL_STOPPED
            break
        for call in calls:
            name, arguments = call["function"]["name"], call["function"].get("arguments") or "{}"
            output = toolbox.call(name, arguments)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
            transcript.add("tool", name=name, tool_call_id=call["id"], arguments=arguments, content=output)
            if name in ("run_check", "run_benchmark") and toolbox.last_grade:
                score = toolbox.last_grade.get("score")
                if score is not None:
                    best = score if best is None else max(best, score)
                result.steps.append(
                    {"turn": result.turns, "tokens": result.usage.total, "usd": result.cost_usd, "best_score": best}
                )
        if toolbox.submitted:
            result.stop_reason = StopReason.SUBMITTED
            break
    result.wall_s = time.monotonic() - started
    transcript.add("stop", reason=result.stop_reason.value, turns=result.turns, usage=vars(result.usage), cost_usd=result.cost_usd)
    return result


def fault_outcome(result: AgentResult) -> Optional[Outcome]:
    return Outcome(result.fault["outcome"]) if result.fault else None
