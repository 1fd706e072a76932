"""The agent loop: prompt → model turn → tool calls → results, until submit, stop, or a budget ends.

Budgets are checked before every model call; the first one spent is the stop reason. The wall clock also bounds
each model call and its retries (``deadline``); turns count model calls; tokens are input + output of every call;
dollars are the calls' costs. Both count the garbled replies a provider bills and the loop retries or ends on.

Context rule (see docs/transcripts.md): the conversation's size is the larger of the last call's reported
input + output tokens and its characters / 4. Before a call, if the size exceeds 75% of the model's context window,
older turns are shortened: every tool result except the last ``keep`` becomes ``[shortened: N characters]``
followed by its first 200 characters, and so does every string argument longer than 200 characters of the
assistant's tool calls except the last ``keep`` calling turns (arguments stay a JSON object). ``keep`` is 4; on a
context-overflow error from the provider the rule is applied again with ``keep`` 2, then 0, calling again each
time; a call that still overflows ends the run with a provider_error fault.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from kbsweep.agent.models import ChatModel, Completion, ContextOverflow, ProviderFault, Usage
from kbsweep.agent.tools import GRADING_TOOLS, Toolbox
from kbsweep.agent.transcript import Transcript
from kbsweep.errors import KbsweepError
from kbsweep.outcomes import Outcome, StopReason

SYSTEM_PROMPT = (
    "You are a GPU kernel engineer. Work only through the tools. Your answer is the file solution.py in the "
    "workspace; check it with run_check, time it with run_benchmark, profile it on one shape with run_profile, and "
    "call submit when done."
)
CONTEXT_FILL = 0.75
KEEP_WHOLE = (4, 2, 0)  # recent turns kept whole: before a call near the window, then after each overflow error
STUB_HEAD = 200


@dataclass
class Budgets:
    wall_s: float = 10_800.0
    max_turns: int = 200
    max_tokens: Optional[int] = None
    max_usd: Optional[float] = None

    @classmethod
    def of_cell(cls, model: Mapping[str, Any], track: Mapping[str, Any]) -> "Budgets":
        """The track's budgets for this model; a dollar budget with a litellm model whose prices are null is a
        KbsweepError (one line), since it could not be enforced."""
        max_usd = track.get("max_usd")
        prices = model.get("prices") or {}
        if (
            max_usd is not None
            and model.get("provider") == "litellm"
            and None in (prices.get("input"), prices.get("output"))
        ):
            raise KbsweepError(
                f"model '{model['name']}' has no prices (prices.input/output are null), so track.max_usd={max_usd:g} "
                "cannot be enforced: set its prices (with date and source) or drop the dollar budget"
            )
        return cls(
            wall_s=track["time_cap_s"],
            max_turns=track["max_turns"],
            max_tokens=track.get("max_tokens"),
            max_usd=max_usd,
        )


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


def stub(text: str) -> str:
    if len(text) <= STUB_HEAD or text.startswith("[shortened"):
        return text
    return f"[shortened: {len(text)} characters] {text[:STUB_HEAD]}"


def stub_arguments(arguments: str) -> str:
    """Tool-call arguments with long string values stubbed; malformed long arguments become ``{"shortened": ...}``."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return json.dumps({"shortened": stub(arguments)}) if len(arguments) > STUB_HEAD else arguments
    if not isinstance(parsed, dict):
        return arguments
    short = {k: stub(v) if isinstance(v, str) else v for k, v in parsed.items()}
    return arguments if short == parsed else json.dumps(short)


def shorten_context(messages: List[Dict[str, Any]], keep: int) -> int:
    """Apply the context rule, keeping the last ``keep`` tool results and calling turns whole; returns how many
    tool results and arguments were shortened."""
    shortened = 0
    results = [m for m in messages if m["role"] == "tool"]
    for message in results[: max(0, len(results) - keep)]:
        short = stub(message["content"])
        shortened += short != message["content"]
        message["content"] = short
    calling = [m for m in messages if m["role"] == "assistant" and m.get("tool_calls")]
    for message in calling[: max(0, len(calling) - keep)]:
        for call in message["tool_calls"]:
            short = stub_arguments(call["function"]["arguments"])
            shortened += short != call["function"]["arguments"]
            call["function"]["arguments"] = short
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


def complete_logged(model: ChatModel, messages, tools, deadline: float, transcript: Transcript) -> Completion:
    """One ``model.complete``; the retries it made (``last_retries``, when the model keeps them) go to the transcript."""
    try:
        return model.complete(messages, tools, deadline=deadline)
    finally:
        for retry in getattr(model, "last_retries", None) or []:
            transcript.add("retry", **retry)


def call_model(
    model: ChatModel, messages, tools, window: int, size: int, deadline: float, transcript: Transcript
) -> Completion:
    """One model turn under the context rule (``size``: the last call's reported tokens). What a call that
    overflowed was billed (a garbled reply it retried first) is the turn's: added to the answer's Completion
    (``failed_usage``), or to the fault that ends the turn, so the transcript's events hold every token paid for."""
    if max(size, estimate_tokens(messages)) > CONTEXT_FILL * window:
        shortened = shorten_context(messages, KEEP_WHOLE[0])
        transcript.add("compaction", shortened=shortened, keep=KEEP_WHOLE[0], reason="near the context window")
    billed, billed_usd = Usage(), 0.0
    try:
        for keep in KEEP_WHOLE[1:]:
            try:
                completion = complete_logged(model, messages, tools, deadline, transcript)
                break
            except ContextOverflow as overflow:
                billed.add(overflow.usage)
                billed_usd += overflow.cost_usd
                transcript.add("compaction", shortened=shorten_context(messages, keep), keep=keep, reason=str(overflow))
        else:
            completion = complete_logged(model, messages, tools, deadline, transcript)
    except ProviderFault as fault:
        fault.usage.add(billed)
        fault.cost_usd += billed_usd
        raise
    completion.usage.add(billed)
    completion.failed_usage.add(billed)
    completion.cost_usd += billed_usd
    return completion


def note_grade(result: AgentResult, grade: Optional[Dict[str, Any]], transcript: Optional[Transcript] = None) -> None:
    """After a grading tool (check, benchmark, profile): a step with the turn, tokens, dollars and the best score so far (also a ``step``
    event of ``transcript``, which the orchestrator reads while the cell runs; a CLI harness writes its transcript
    only at the end, so it passes none)."""
    if not grade:
        return
    scores = [s["best_score"] for s in result.steps if s["best_score"] is not None]
    if grade.get("score") is not None:
        scores.append(grade["score"])
    result.steps.append(
        {
            "turn": result.turns,
            "tokens": result.usage.total,
            "usd": result.cost_usd,
            "best_score": max(scores, default=None),
        }
    )
    if transcript is not None:
        transcript.add("step", **result.steps[-1])


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
    deadline = started + budgets.wall_s
    size = 0
    while True:
        stop = budget_stop(result, budgets, started)
        if stop:
            result.stop_reason = stop
            break
        try:
            completion = call_model(model, messages, tools, context_window, size, deadline, transcript)
        except ProviderFault as fault:
            result.usage.add(fault.usage)  # a garbled reply is billed even when it ends the run
            result.cost_usd += fault.cost_usd
            transcript.add(
                "error",
                outcome=fault.outcome.value,
                message=str(fault),
                usage=vars(fault.usage),
                cost_usd=fault.cost_usd,
            )
            if time.monotonic() >= deadline:  # the clock ran out while the provider was failing: a budget stop
                result.stop_reason = StopReason.WALL_CLOCK
            else:
                result.stop_reason = StopReason.PROVIDER_FAULT
                result.fault = {"outcome": fault.outcome.value, "message": str(fault)}
            break
        result.turns += 1
        result.usage.add(completion.usage)
        result.cost_usd += completion.cost_usd
        size = completion.usage.total - completion.failed_usage.total  # the answer's own: the conversation's size
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
            if name in GRADING_TOOLS:
                note_grade(result, toolbox.last_grade, transcript)
        if toolbox.submitted:
            result.stop_reason = StopReason.SUBMITTED
            break
    result.wall_s = time.monotonic() - started
    transcript.add(
        "stop",
        reason=result.stop_reason.value,
        turns=result.turns,
        usage=vars(result.usage),
        cost_usd=result.cost_usd,
        wall_s=result.wall_s,
    )
    return result


def fault_outcome(result: AgentResult) -> Optional[Outcome]:
    return Outcome(result.fault["outcome"]) if result.fault else None
