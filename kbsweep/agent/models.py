"""The model interface of the agent loop, and the built-in offline models (scripted, replay)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Protocol

from kbsweep.outcomes import Outcome


@dataclass
class Usage:
    """Token counts of one call or a whole run."""

    input_tokens: int = 0  # the prompt's, cache reads and writes included
    output_tokens: int = 0
    cached_tokens: int = 0  # of the input, read from the provider's prompt cache
    cache_write_tokens: int = 0  # of the input, written to it
    reasoning_tokens: int = 0  # of the output, spent reasoning

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: "Usage") -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)


@dataclass
class Completion:
    """One assistant turn in OpenAI chat format.

    ``message`` is ``{"role": "assistant", "content": str|None, "tool_calls": [...]}``; each tool call is
    ``{"id", "type": "function", "function": {"name", "arguments": <json string>}}``. ``reasoning`` holds the
    provider's reasoning text when it returns one. ``usage`` and ``cost_usd`` are what the turn was billed: the
    answer's, plus any garbled replies retried before it (``failed_usage``, their part of ``usage``).
    """

    message: dict[str, Any]
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    failed_usage: Usage = field(default_factory=Usage)
    latency_s: float = 0.0
    finish_reason: str = "stop"
    reasoning: str | None = None


class ProviderFault(Exception):
    """A provider call that failed for good (after retries); classified, never scored. ``status`` (None without
    one) and ``answer`` are the last attempt's HTTP status and what the provider said; ``attempts`` the calls made;
    ``usage`` and ``cost_usd`` what the failed attempts were billed (a garbled reply's tokens are paid for);
    ``reached`` False when no provider answered at all (``answer`` then says why: ``cannot reach <host>: …``)."""

    def __init__(
        self,
        outcome: Outcome,
        message: str,
        *,
        status: int | None = None,
        answer: str | None = None,
        attempts: int = 1,
        usage: Usage | None = None,
        cost_usd: float = 0.0,
        reached: bool = True,
    ):
        super().__init__(message)
        self.reached = reached
        self.outcome = outcome
        self.status = status
        self.answer = answer or message
        self.attempts = attempts
        self.usage = usage or Usage()
        self.cost_usd = cost_usd


class ContextOverflow(ProviderFault):
    """The prompt no longer fits the model's context window: the loop shortens the context and calls again.

    ``outcome`` is PROVIDER_ERROR for when shortening cannot make it fit.
    """

    def __init__(self, message: str, **details: Any):
        super().__init__(Outcome.PROVIDER_ERROR, message, **details)


class ChatModel(Protocol):
    """What the agent loop needs from a model.

    ``deadline`` is a ``time.monotonic()`` instant the call (with its retries) should not run past; models that
    wait on a network bound their waits by it.
    """

    name: str

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], deadline: float | None = None
    ) -> Completion: ...


def synthetic_usage(messages: List[Dict[str, Any]], reply: Dict[str, Any]) -> Usage:
    """Deterministic token counts for offline models: characters / 4."""
    prompt = sum(len(json.dumps(m, default=str)) for m in messages) // 4
    return Usage(input_tokens=prompt, output_tokens=len(json.dumps(reply)) // 4)


def tool_call(index: int, name: str, arguments: Dict[str, Any]) -> Dict[str, Any]:
    return {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


class ScriptedModel:
    """A deterministic fake model playing a script of tool calls through the real loop.

    Each step is ``{tool, args, say, solution}``; ``solution: <name>`` writes the problem's bundled
    ``solutions/<name>.py`` as the file content (the scripted model is allowed to know them), or, where the problem
    has no such file, its ``solutions/reference.py`` (generated for every KernelBench problem). After the last step
    it answers with plain text, which ends the loop.
    """

    def __init__(self, cfg: Any, solutions: Dict[str, Path]):
        self.name = cfg["name"]
        self.steps = list(cfg["script"] or [])
        self.solutions = solutions
        self.position = 0

    def complete(
        self, messages: List[Dict[str, Any]], tools: List[Dict[str, Any]], deadline: float | None = None
    ) -> Completion:
        if self.position >= len(self.steps):
            reply: Dict[str, Any] = {"role": "assistant", "content": "Done.", "tool_calls": []}
            return Completion(message=reply, usage=synthetic_usage(messages, reply))
        step = dict(self.steps[self.position])
        self.position += 1
        arguments = dict(step.get("args") or {})
        if step.get("solution"):
            source = self.solutions.get(step["solution"]) or self.solutions.get("reference")
            arguments["content"] = source.read_text() if source else f"# no bundled solution '{step['solution']}'\n"
        reply = {
            "role": "assistant",
            "content": step.get("say"),
            "tool_calls": [tool_call(self.position, step["tool"], arguments)],
        }
        return Completion(message=reply, usage=synthetic_usage(messages, reply), finish_reason="tool_calls")


class ReplayModel:
    """Plays back the assistant turns of a recorded transcript (regression tests, demos)."""

    def __init__(self, cfg: Any):
        from kbsweep.agent.transcript import read_events

        self.name = cfg["name"]
        self.turns = [e for e in read_events(Path(cfg["transcript"])) if e["type"] == "assistant"]
        self.position = 0

    def complete(
        self, messages: List[Dict[str, Any]], tools: List[Dict[str, Any]], deadline: float | None = None
    ) -> Completion:
        if self.position >= len(self.turns):
            reply: Dict[str, Any] = {"role": "assistant", "content": "End of recorded transcript.", "tool_calls": []}
            return Completion(message=reply)
        event = self.turns[self.position]
        self.position += 1
        reply = {"role": "assistant", "content": event.get("content"), "tool_calls": event.get("tool_calls") or []}
        return Completion(
            message=reply,
            usage=Usage(**event.get("usage", {})),
            cost_usd=event.get("cost_usd", 0.0),
            finish_reason=event.get("finish_reason") or "stop",
            reasoning=event.get("reasoning"),
        )
