"""Export a kbsweep transcript to the Hugging Face agent-trace-viewer format (a Claude Code session JSONL).

:func:`to_claude_code` is a pure function from our events (docs/transcripts.md) to session records:

* three header records: ``custom-title``, ``ai-title`` (both the title) and ``mode`` (``normal``);
* ``user`` → a ``user`` record with the prompt as its content; ``system`` (our system prompt) is dropped;
* ``assistant`` → an ``assistant`` record whose content blocks are ``thinking`` (reasoning, empty signature),
  ``text`` and one ``tool_use`` per tool call (``input`` is the parsed arguments, or ``{"raw_arguments": ...}``
  when they were not a JSON object), with Anthropic-style usage (``input_tokens`` excludes cache reads and writes);
* ``tool`` → a ``user`` record holding one ``tool_result`` (content capped at 80,000 characters; ``is_error`` when
  the result starts with ``error:``);
* ``retry``, ``compaction``, ``error`` and ``stop`` → ``system`` records with a one-line ``content``.

Every record carries ``parentUuid`` (the previous record's ``uuid``), ``isSidechain``, ``userType``, ``cwd``,
``sessionId``, ``version``, ``gitBranch``, ``entrypoint`` and an ISO ``timestamp``; uuids are derived from the session
id and the record's position, so the same transcript always exports to the same lines.

``python -m kbsweep.agent.trace_export transcript.jsonl out.jsonl [--title T]`` writes one file.
"""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

VERSION = "2.1.181"  # the Claude Code version the viewer's parser is known to read
RESULT_CAP = 80_000
STOP_REASONS = {"tool_calls": "tool_use", "stop": "end_turn", "length": "max_tokens"}


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def tool_input(arguments: Optional[str]) -> Dict[str, Any]:
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"raw_arguments": arguments}


def assistant_message(event: Dict[str, Any], model: str, index: int) -> Dict[str, Any]:
    content: List[Dict[str, Any]] = []
    if event.get("reasoning"):
        content.append({"type": "thinking", "thinking": event["reasoning"], "signature": ""})
    if event.get("content"):
        content.append({"type": "text", "text": event["content"]})
    for call in event.get("tool_calls") or []:
        function = call["function"]
        content.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": function["name"],
                "input": tool_input(function.get("arguments")),
            }
        )
    usage = event.get("usage") or {}
    reason = event.get("finish_reason")
    cached, written = usage.get("cached_tokens", 0), usage.get("cache_write_tokens", 0)
    return {
        "id": f"msg_{index:04d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": STOP_REASONS.get(reason, reason) if reason else reason,
        "usage": {
            "input_tokens": max(0, usage.get("input_tokens", 0) - cached - written),
            "output_tokens": usage.get("output_tokens", 0),
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": written,
        },
    }


def system_line(event: Dict[str, Any]) -> str:
    kind = event["type"]
    if kind == "retry":
        return f"provider retry {event.get('attempt')}: {event.get('message')} (waited {event.get('delay_s', 0):.1f} s)"
    if kind == "compaction":
        return f"context shortened: {event.get('shortened')} items, last {event.get('keep')} turns kept ({event.get('reason')})"
    if kind == "error":
        return f"provider fault {event.get('outcome')}: {event.get('message')}"
    return f"stopped: {event.get('reason')} after {event.get('turns')} turns, ${event.get('cost_usd', 0):.4f}"


def to_claude_code(
    events: Iterable[Dict[str, Any]], session_id: str, title: str, model: str = "", cwd: str = "/workspace"
) -> List[Dict[str, Any]]:
    """Claude Code session records for our ``events`` (see the module docstring)."""
    events = list(events)
    header = [
        {"type": "custom-title", "customTitle": title, "sessionId": session_id},
        {"type": "ai-title", "aiTitle": title, "sessionId": session_id},
        {"type": "mode", "mode": "normal", "sessionId": session_id},
    ]
    records: List[Dict[str, Any]] = []
    parent: Optional[str] = None
    for index, event in enumerate(events):
        kind = event["type"]
        extra: Dict[str, Any]
        if kind == "user":
            extra = {
                "type": "user",
                "message": {"role": "user", "content": event.get("content") or ""},
                "promptId": f"prompt_{index:04d}",
            }
        elif kind == "assistant":
            extra = {
                "type": "assistant",
                "message": assistant_message(event, model, index),
                "requestId": f"req_{index:04d}",
            }
        elif kind == "tool":
            text = event.get("content") or ""
            result = {
                "type": "tool_result",
                "tool_use_id": event["tool_call_id"],
                "content": text[:RESULT_CAP],
                "is_error": text.startswith("error:"),
            }
            extra = {"type": "user", "message": {"role": "user", "content": [result]}}
        elif kind in ("retry", "compaction", "error", "stop"):
            level = "error" if kind == "error" else "info"
            extra = {"type": "system", "subtype": "informational", "content": system_line(event), "level": level}
        else:
            continue  # our system prompt, and any event kind the viewer has no place for
        record_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"kbsweep:{session_id}:{index}"))
        records.append(
            {
                "parentUuid": parent,
                "isSidechain": False,
                "userType": "external",
                "cwd": cwd,
                "sessionId": session_id,
                "version": VERSION,
                "gitBranch": "",
                "entrypoint": "cli",
                **extra,
                "uuid": record_id,
                "timestamp": iso(event["ts"]),
            }
        )
        parent = record_id
    return header + records


def trace_jsonl(events: List[Dict[str, Any]], run_id: str, title: str, model: str) -> str:
    """One run's transcript as trace-viewer JSONL; the session id derives from the MLflow run id."""
    session = str(uuid.uuid5(uuid.NAMESPACE_URL, f"kbsweep:run:{run_id}"))
    return "".join(json.dumps(r, default=str) + "\n" for r in to_claude_code(events, session, title, model))


def main(argv: Optional[List[str]] = None) -> None:
    from kbsweep.agent.transcript import read_events

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("transcript", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--title", default=None)
    parser.add_argument("--model", default="")
    args = parser.parse_args(argv)
    session = str(uuid.uuid5(uuid.NAMESPACE_URL, f"kbsweep:{args.transcript.resolve()}"))
    records = to_claude_code(
        read_events(args.transcript), session, args.title or args.transcript.parent.name, args.model
    )
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records))


if __name__ == "__main__":
    main()
