"""Claude Code (`@anthropic-ai/claude-code`) as a runner: ``claude -p … --output-format stream-json``.

Its wire is Anthropic Messages (``ANTHROPIC_BASE_URL``); nonessential traffic (telemetry, update checks) is off,
so the proxy is the only address it dials. Where the track forbids the shell it gets only its file tools
(``--tools``: no Bash, no subagents or skills that could reach one) and kbsweep's over MCP. Its stream: ``system/init``, then ``assistant`` messages (text,
thinking and tool_use blocks, possibly one record per block of the same message) and ``user`` records holding
the tool results, then ``result``.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

from kbsweep.agent.models import Usage
from kbsweep.harness.base import AgentJob, register
from kbsweep.harness.cli_agent import CliRunner, Event, Record, Session
from kbsweep.harness.proxy import ModelProxy

FILE_TOOLS = "Read,Write,Edit,Glob,Grep"  # its tools that run no command
REJECTED = "<tool_use_error>"  # how it answers a call it refused to run (a tool it lacks, input it cannot parse)


def kbsweep_usage(anthropic: Optional[Mapping[str, Any]]) -> Dict[str, int]:
    """Anthropic-style usage (disjoint input counts) as kbsweep's (input includes cache reads and writes)."""
    usage = anthropic or {}
    cached, written = int(usage.get("cache_read_input_tokens") or 0), int(usage.get("cache_creation_input_tokens") or 0)
    return vars(
        Usage(
            input_tokens=int(usage.get("input_tokens") or 0) + cached + written,
            output_tokens=int(usage.get("output_tokens") or 0),
            cached_tokens=cached,
            cache_write_tokens=written,
        )
    )


def assistant_event(
    ts: float,
    content: Optional[str],
    calls: List[Dict[str, Any]],
    reasoning: Optional[str] = None,
    usage: Optional[Dict[str, int]] = None,
    finish_reason: Optional[str] = None,
) -> Event:
    """An ``assistant`` event; cost and latency are the proxy's (the run's totals), not per turn."""
    return (
        ts,
        "assistant",
        {
            "content": content,
            "tool_calls": calls,
            "reasoning": reasoning,
            "usage": usage or vars(Usage()),
            "cost_usd": 0.0,
            "latency_s": None,
            "finish_reason": finish_reason or ("tool_calls" if calls else "stop"),
        },
    )


def tool_call(call_id: Optional[str], name: str, arguments: Any) -> Dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def result_text(content: Any) -> str:
    """A tool_result's content: a string, or text blocks."""
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content or "")


@register
class ClaudeCodeRunner(CliRunner):
    name = "claude-code"

    def command(self, job: AgentJob, session: Session) -> Tuple[List[str], Dict[str, str]]:
        argv = [
            *session.cli,
            "-p",
            session.prompt,
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
            "--model",
            job.model["name"],
        ]
        if session.tools:
            servers = {
                "mcpServers": {"kbsweep": {"type": "stdio", "command": session.tools[0], "args": session.tools[1:]}}
            }
            argv += ["--tools", FILE_TOOLS, "--mcp-config", json.dumps(servers), "--strict-mcp-config"]
        wall_ms = str(int(job.toolbox.sandbox.policy.wall_s * 1000))
        return argv, {
            "ANTHROPIC_BASE_URL": session.url,
            "ANTHROPIC_API_KEY": session.token,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_RETRIES": "1",  # the proxy has retried already; a refused call ends the run there
            "IS_SANDBOX": "1",  # it refuses to skip permissions as root otherwise (the sandbox drops root anyway)
            # its Bash tool stops a command after 2 minutes by default: give it run_shell's limit (a check can be long),
            # and the same to a call of kbsweep's tools over MCP
            "BASH_DEFAULT_TIMEOUT_MS": wall_ms,
            "BASH_MAX_TIMEOUT_MS": wall_ms,
            "MCP_TOOL_TIMEOUT": wall_ms,
        }

    def normalize(self, records: List[Record], proxy: ModelProxy) -> List[Event]:
        events: List[Event] = []
        calls: Dict[str, Dict[str, Any]] = {}
        last_id: Optional[str] = None
        last_blocks: List[Dict[str, Any]] = []
        for ts, record in records:
            message = record.get("message") or {}
            content = message.get("content")
            blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
            if record.get("type") == "assistant":
                if (
                    message.get("id") == last_id and events and events[-1][1] == "assistant"
                ):  # the same turn, block by block
                    events.pop()
                    blocks = [*last_blocks, *blocks]
                turn = [
                    tool_call(b["id"], b["name"], b.get("input") or {}) for b in blocks if b.get("type") == "tool_use"
                ]
                calls.update((c["id"], c) for c in turn)
                text = "\n".join(b["text"] for b in blocks if b.get("type") == "text") or None
                thinking = "\n".join(b.get("thinking", "") for b in blocks if b.get("type") == "thinking") or None
                events.append(
                    assistant_event(
                        ts, text, turn, thinking, kbsweep_usage(message.get("usage")), message.get("stop_reason")
                    )
                )
                last_id, last_blocks = message.get("id"), blocks
            elif record.get("type") == "user":
                for block in (b for b in blocks if b.get("type") == "tool_result"):
                    use_id = block.get("tool_use_id")  # None in a result the stream cut short
                    call = calls.get(use_id or "", tool_call(use_id, "unknown", {}))
                    content = result_text(block.get("content"))
                    rejected = bool(block.get("is_error")) and content.startswith(REJECTED)
                    if block.get("is_error") and not content.startswith("error:"):
                        content = f"error: {content}"
                    events.append(
                        (
                            ts,
                            "tool",
                            {
                                "name": call["function"]["name"],
                                "tool_call_id": call["id"],
                                "arguments": call["function"]["arguments"],
                                "content": content,
                                **({"rejected": True} if rejected else {}),
                            },
                        )
                    )
        return events
