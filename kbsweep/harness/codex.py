"""Codex CLI (`@openai/codex`) as a runner: ``codex exec --json``.

Its wire is the OpenAI Responses API, through a custom provider in ``$CODEX_HOME/config.toml``; analytics, update
checks and plugin fetches are off, so the proxy is the only address it dials. Its approval policy is ``never`` and
its own sandbox off: kbsweep's sandbox confines it. Its stream: ``thread.started``, ``turn.started``,
``item.started/updated/completed`` (agent_message, reasoning, command_execution, file_change, ...),
``turn.completed`` with the turn's usage.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from kbsweep.agent.models import Usage
from kbsweep.harness.base import AgentJob, register
from kbsweep.harness.cli_agent import WORKING_NOTE, CliRunner, Event, Record, assistant_event, tool_call

TOKEN_VARIABLE = "KBSWEEP_PROXY_KEY"
CONFIG = """model = {model}
model_context_window = {context_window}
model_provider = "kbsweep"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.kbsweep]
name = "kbsweep"
base_url = {base_url}
wire_api = "responses"
env_key = "{token_variable}"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false
in_app_updates = false
unbounded_connection_retries = false
"""


def item_call(item: Dict[str, Any]) -> Tuple[str, Any, str]:
    """(tool name, arguments, result) of a completed tool item of Codex's stream."""
    kind = item.get("type")
    if kind == "command_execution":
        return "exec_command", {"cmd": item.get("command")}, f"exit code {item.get('exit_code')}\n{item.get('aggregated_output') or ''}"
    if kind == "file_change":
        return "apply_patch", {"changes": item.get("changes")}, str(item.get("status"))
    details = {k: v for k, v in item.items() if k not in ("id", "type", "status", "result", "error")}
    return str(kind), details, json.dumps(item.get("result") or item.get("error") or item.get("status"))


@register
class CodexRunner(CliRunner):
    name = "codex"

    def command(self, job: AgentJob, url: str, token: str, home: Path, workspace: str) -> Tuple[List[str], Dict[str, str]]:
        config = CONFIG.format(model=json.dumps(job.model["name"]), context_window=job.model["context_window"], base_url=json.dumps(f"{url}/v1"), token_variable=TOKEN_VARIABLE)
        (home / ".codex").mkdir()
        (home / ".codex" / "config.toml").write_text(config)
        argv = [str(self.executable()), "exec", "--json", "--skip-git-repo-check", "--ephemeral", "-C", workspace,
                job.prompt + WORKING_NOTE.format(workspace=workspace)]
        return argv, {TOKEN_VARIABLE: token}  # its config is read from $HOME/.codex

    def normalize(self, records: List[Record]) -> List[Event]:
        events: List[Event] = []
        reasoning: Optional[str] = None
        for ts, record in records:
            kind, item = record.get("type"), record.get("item") or {}
            if kind == "turn.completed":  # the turn's usage, on its last model turn (Codex reports no finer counts)
                usage = record.get("usage") or {}
                turns = [i for i, e in enumerate(events) if e[1] == "assistant"]
                if turns:
                    events[turns[-1]][2]["usage"] = vars(Usage(input_tokens=int(usage.get("input_tokens") or 0),
                                                               output_tokens=int(usage.get("output_tokens") or 0),
                                                               cached_tokens=int(usage.get("cached_input_tokens") or 0)))
            if kind != "item.completed":
                continue
            if item.get("type") == "error":  # a notice of the CLI's own (unknown model metadata), not a turn
                continue
            if item.get("type") == "reasoning":
                reasoning = item.get("text")
            elif item.get("type") == "agent_message":
                events.append(assistant_event(ts, item.get("text"), [], reasoning))
                reasoning = None
            else:
                name, arguments, output = item_call(item)
                call = tool_call(str(item.get("id")), name, arguments)
                events.append(assistant_event(ts, None, [call], reasoning))
                events.append((ts, "tool", {"name": name, "tool_call_id": call["id"], "arguments": call["function"]["arguments"], "content": output}))
                reasoning = None
        return events
