"""Codex CLI (`@openai/codex`) as a runner: ``codex exec --json``.

Its wire is the OpenAI Responses API, through a custom provider in ``$CODEX_HOME/config.toml``; analytics, update
checks and plugin fetches are off, so the proxy is the only address it dials. Its approval policy is ``never`` and
its own sandbox off: kbsweep's sandbox confines it. Where the track forbids the shell its shell tool is off
(``features.shell_tool``) and kbsweep's tools come over MCP. Its transcript is the proxy's record of the
conversation (:attr:`~kbsweep.harness.proxy.ModelProxy.turns`): its own stream (``item.*`` events) leaves out the
calls its tool router refuses (a tool it does not offer, arguments that miss a field), which are kept there and
marked ``rejected``.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

from kbsweep.harness.base import AgentJob, register
from kbsweep.harness.cli_agent import CliRunner, Event, Record, Session
from kbsweep.harness.proxy import ModelProxy

TOKEN_VARIABLE = "KBSWEEP_PROXY_KEY"
# how its tool router answers a call it runs nothing for
REJECTED = ("unsupported call: ", "unsupported custom tool call: ", "failed to parse function arguments: ")
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
NO_SHELL = """shell_tool = false

[mcp_servers.kbsweep]
command = {command}
args = {args}
startup_timeout_sec = 60
tool_timeout_sec = {timeout_s}
"""  # follows CONFIG, whose last table is [features]


def rejected(tool: Dict[str, Any]) -> Dict[str, Any]:
    return {**tool, "content": f"error: {tool['content']}", "rejected": True}


@register
class CodexRunner(CliRunner):
    name = "codex"

    def command(self, job: AgentJob, session: Session) -> Tuple[List[str], Dict[str, str]]:
        config = CONFIG.format(
            model=json.dumps(job.model["name"]),
            context_window=job.model["context_window"],
            base_url=json.dumps(f"{session.url}/v1"),
            token_variable=TOKEN_VARIABLE,
        )
        if session.tools:
            config += NO_SHELL.format(
                command=json.dumps(session.tools[0]),
                args=json.dumps(session.tools[1:]),
                timeout_s=int(job.toolbox.sandbox.policy.wall_s),
            )
        (session.home / ".codex").mkdir()
        (session.home / ".codex" / "config.toml").write_text(config)
        argv = [
            *session.cli,
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--ephemeral",
            "-C",
            session.workspace,
            session.prompt,
        ]
        return argv, {TOKEN_VARIABLE: session.token}  # its config is read from $HOME/.codex

    def normalize(self, records: List[Record], proxy: ModelProxy) -> List[Event]:
        return [
            (ts, kind, rejected(fields) if kind == "tool" and fields["content"].startswith(REJECTED) else fields)
            for ts, kind, fields in proxy.turns
        ]
