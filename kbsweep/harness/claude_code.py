"""Claude Code (`@anthropic-ai/claude-code`) as a runner: ``claude -p … --output-format stream-json``.

Its wire is Anthropic Messages (``ANTHROPIC_BASE_URL``); nonessential traffic (telemetry, update checks) is off,
so the proxy is the only address it dials. Its stream: ``system/init``, then ``assistant`` messages (text,
thinking and tool_use blocks, possibly one record per block of the same message) and ``user`` records holding
the tool results, then ``result``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

from kbsweep.harness.base import AgentJob, register
from kbsweep.harness.cli_agent import WORKING_NOTE, CliRunner, Event, Record, assistant_event, kbsweep_usage, tool_call


def result_text(content: Any) -> str:
    """A tool_result's content: a string, or text blocks."""
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content or "")


@register
class ClaudeCodeRunner(CliRunner):
    name = "claude-code"

    def command(self, job: AgentJob, url: str, token: str, home: Path, workspace: str) -> Tuple[List[str], Dict[str, str]]:
        argv = [str(self.executable()), "-p", job.prompt + WORKING_NOTE.format(workspace=workspace), "--output-format", "stream-json",
                "--verbose", "--dangerously-skip-permissions", "--model", job.model["name"]]
        return argv, {
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": token,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_RETRIES": "1",  # the proxy has retried already; a refused call ends the run there
            "IS_SANDBOX": "1",  # it refuses to skip permissions as root otherwise (the sandbox drops root anyway)
            # its Bash tool stops a command after 2 minutes by default: give it run_shell's limit (a check can be long)
            "BASH_DEFAULT_TIMEOUT_MS": str(int(job.toolbox.sandbox.policy.wall_s * 1000)),
            "BASH_MAX_TIMEOUT_MS": str(int(job.toolbox.sandbox.policy.wall_s * 1000)),
        }

    def normalize(self, records: List[Record]) -> List[Event]:
        events: List[Event] = []
        calls: Dict[str, Dict[str, Any]] = {}
        last_id, last_blocks = None, []
        for ts, record in records:
            message = record.get("message") or {}
            content = message.get("content")
            blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
            if record.get("type") == "assistant":
                if message.get("id") == last_id and events and events[-1][1] == "assistant":  # the same turn, block by block
                    events.pop()
                    blocks = [*last_blocks, *blocks]
                turn = [tool_call(b["id"], b["name"], b.get("input") or {}) for b in blocks if b.get("type") == "tool_use"]
                calls.update((c["id"], c) for c in turn)
                text = "\n".join(b["text"] for b in blocks if b.get("type") == "text") or None
                thinking = "\n".join(b.get("thinking", "") for b in blocks if b.get("type") == "thinking") or None
                events.append(assistant_event(ts, text, turn, thinking, kbsweep_usage(message.get("usage")), message.get("stop_reason")))
                last_id, last_blocks = message.get("id"), blocks
            elif record.get("type") == "user":
                for block in (b for b in blocks if b.get("type") == "tool_result"):
                    call = calls.get(block.get("tool_use_id"), tool_call(block.get("tool_use_id"), "unknown", {}))
                    content = result_text(block.get("content"))
                    if block.get("is_error") and not content.startswith("error:"):
                        content = f"error: {content}"
                    events.append((ts, "tool", {"name": call["function"]["name"], "tool_call_id": call["id"],
                                                "arguments": call["function"]["arguments"], "content": content}))
        return events
