"""The model proxy: the only way a CLI harness reaches its model, and the host end of its check tool.

:class:`ModelProxy` is an HTTP server on 127.0.0.1 in the orchestrator, one per cell. A harness in the sandbox
reaches it through :class:`kbsweep.sandbox.net.Relay` and holds only a per-cell token, revoked when the cell ends; the
provider key stays in the orchestrator's environment, read by the cell's ChatModel (``LiteLLMModel``) at each call.

It speaks the two wires the CLIs use, both carried over litellm's own translations to and from chat completions
(the Anthropic adapter of its proxy, and its Responses-to-chat bridge), then calls the model exactly as the built-in
loop does: the same route, retries, fault classification, usage and cost. litellm's proxy *server* is not used:
its ``[proxy]`` extra does not resolve at the pinned litellm, and it forwards ``/v1/responses`` unchanged to
OpenAI-compatible servers that only offer chat completions, which Codex then cannot use.

* ``POST /v1/messages`` (Claude Code): Anthropic Messages, streamed as the full Anthropic event sequence.
* ``POST /v1/responses`` (Codex): OpenAI Responses, streamed as ``response.*`` events.
* ``POST /kbsweep/tool`` ``{"name", "arguments"}``: one of the built-in loop's tools (``SERVED``), for
  ``kbsweep-check`` and the MCP server of :mod:`kbsweep.harness.tool_server`.

Budgets are checked before every model call, as in the loop: once one is spent, or a provider call fails for good
(after the model's own retries), the call is refused and ``ended`` is set; the runner then stops the harness.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterable, List, Optional, Tuple
from urllib.parse import urlsplit

from kbsweep.agent.loop import AgentResult, Budgets, budget_stop, note_grade
from kbsweep.agent.models import ChatModel, Completion, ContextOverflow, ProviderFault
from kbsweep.agent.tools import GRADING_TOOLS, Toolbox
from kbsweep.outcomes import StopReason

MAX_BODY = 64 * 2**20
# the built-in loop's tools a harness reaches through the proxy: not run_shell (a CLI's shell, where the track allows
# one, is its own) nor submit (a CLI ends by itself)
SERVED = ("write_file", "read_file", "list_files", *GRADING_TOOLS)


class Refused(Exception):
    """A model call the proxy answers with an error instead (``status``, one-line ``message``)."""

    def __init__(self, status: int, message: str, overflow: bool = False):
        super().__init__(message)
        self.status, self.overflow = status, overflow


def model_response(completion: Completion, model: str):
    """A completion as the litellm ``ModelResponse`` its translations read."""
    import litellm

    usage = completion.usage
    return litellm.ModelResponse(
        id=f"chatcmpl-{uuid.uuid4().hex[:24]}",
        model=model,
        choices=[{"index": 0, "message": completion.message, "finish_reason": completion.finish_reason}],
        usage={
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.total,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        },
    )


def anthropic_events(message: Dict[str, Any]) -> Iterable[Tuple[str, Dict[str, Any]]]:
    """A whole Anthropic message as the stream of events a streaming client expects (message_start … message_stop)."""
    usage = message.get("usage") or {}
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(message.get("content") or []):
        kind = block.get("type")
        if kind == "tool_use":
            opening, delta = (
                {**block, "input": {}},
                {"type": "input_json_delta", "partial_json": json.dumps(block.get("input") or {})},
            )
        elif kind == "thinking":
            opening, delta = (
                {**block, "thinking": ""},
                {"type": "thinking_delta", "thinking": block.get("thinking", "")},
            )
        else:
            opening, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block.get("text", "")}
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": opening}
        yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    ending = {"stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence")}
    yield "message_delta", {"type": "message_delta", "delta": ending, "usage": usage}
    yield "message_stop", {"type": "message_stop"}


def responses_events(response: Dict[str, Any]) -> Iterable[Tuple[str, Dict[str, Any]]]:
    """A whole Responses API response as its stream: created, each output item added and done, completed."""
    yield (
        "response.created",
        {"type": "response.created", "response": {**response, "status": "in_progress", "output": []}},
    )
    for index, item in enumerate(response.get("output") or []):
        yield "response.output_item.added", {"type": "response.output_item.added", "output_index": index, "item": item}
        yield "response.output_item.done", {"type": "response.output_item.done", "output_index": index, "item": item}
    yield "response.completed", {"type": "response.completed", "response": response}


class ModelProxy:
    """Serves one cell's harness (see the module docstring); a context manager that starts and stops it.

    ``result`` accumulates the run's turns, usage, dollars, checks and fault as the built-in loop's AgentResult;
    ``events`` holds the retry and error events for the transcript; ``ended`` is set when the run must stop.
    ``turns`` is the Responses wire's conversation as the model had it: each assistant turn and each tool result
    the harness sent back (Codex's own stream leaves out the calls it refuses to run).
    """

    def __init__(self, model: ChatModel, route: str, budgets: Budgets, toolbox: Toolbox):
        self.model, self.route, self.budgets, self.toolbox = model, route, budgets, toolbox
        self.token = f"kbsweep-{secrets.token_hex(16)}"
        self.result = AgentResult(stop_reason=StopReason.MODEL_STOPPED)
        self.events: List[Tuple[float, str, Dict[str, Any]]] = []
        self.turns: List[Tuple[float, str, Dict[str, Any]]] = []
        self.pending: Dict[str, Dict[str, Any]] = {}  # call id -> the tool event its result completes
        self.ended = threading.Event()
        self.failure: Optional[str] = None  # a request the proxy could not serve (its own fault, not the model's)
        self.calls = threading.Lock()  # one model call at a time: budgets are checked against every call before it
        self.started = time.monotonic()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                proxy.handle(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True

    @property
    def address(self) -> Tuple[str, int]:
        host, port = self.server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's
        return host, port

    def __enter__(self) -> "ModelProxy":
        self.started = time.monotonic()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.token = ""  # revoked: a harness process that outlived its cell gets nothing more
        self.server.shutdown()
        self.server.server_close()
        self.result.wall_s = time.monotonic() - self.started

    # ---------------------------------------------------------------------------------------------- requests
    def handle(self, request: BaseHTTPRequestHandler) -> None:
        headers = request.headers
        offered = headers.get("x-api-key") or (headers.get("authorization") or "").removeprefix("Bearer ").strip()
        size = int(headers.get("content-length") or 0)
        body = request.rfile.read(size) if size <= MAX_BODY else b""
        path = urlsplit(request.path).path.rstrip("/")
        if not self.token or not secrets.compare_digest(offered, self.token):
            return send(
                request, 401, {"error": {"type": "authentication_error", "message": "kbsweep proxy: bad token"}}
            )
        try:
            payload = json.loads(body or b"{}")
            if path.endswith("/messages/count_tokens"):  # Claude Code sizes its context with it
                return send(request, 200, {"input_tokens": len(body) // 4})
            if path.endswith("/messages"):
                return self.anthropic(request, payload)
            if path.endswith("/responses"):
                return self.responses(request, payload)
            if path == "/kbsweep/tool":
                return self.tool(request, payload)
            return send(
                request, 404, {"error": {"type": "not_found_error", "message": f"kbsweep proxy: no route {path}"}}
            )
        except Refused as refused:
            return self.refuse(request, path, refused)
        except Exception as exc:  # noqa: BLE001 - a request the proxy cannot serve ends the cell as a harness error
            self.failure = f"{path}: {type(exc).__name__}: {exc}".splitlines()[0]
            self.ended.set()
            return send(request, 500, {"error": {"type": "api_error", "message": f"kbsweep proxy: {self.failure}"}})

    def anthropic(self, request: BaseHTTPRequestHandler, payload: Dict[str, Any]) -> None:
        from litellm.llms.anthropic.messages.adapters.transformation import LiteLLMAnthropicMessagesAdapter

        adapter = LiteLLMAnthropicMessagesAdapter()
        # the request's JSON is the TypedDict litellm names; its translation's TypedDicts are the dicts complete() sends
        chat, names = adapter.translate_anthropic_to_openai(payload)  # type: ignore[arg-type]
        completion = self.complete(chat["messages"], chat.get("tools") or [])  # type: ignore[arg-type]
        message = dict(
            adapter.translate_openai_response_to_anthropic(model_response(completion, payload.get("model", "")), names)
        )
        if payload.get("stream"):
            return stream(request, anthropic_events(message))
        return send(request, 200, message)

    def responses(self, request: BaseHTTPRequestHandler, payload: Dict[str, Any]) -> None:
        from litellm.responses.litellm_completion_transformation.transformation import (
            LiteLLMCompletionResponsesConfig as bridge,
        )

        params = {k: v for k, v in payload.items() if k not in ("model", "input")}
        chat = bridge.transform_responses_api_request_to_chat_completion_request(
            model=self.route,
            input=payload["input"],
            responses_api_request=params,  # type: ignore[arg-type]  # the request's JSON: the TypedDict litellm names
            stream=False,
        )
        self.answered(payload["input"])
        completion = self.complete(chat["messages"], chat.get("tools") or [])
        self.said(completion)
        model = payload.get("model", "")
        response = bridge.transform_chat_completion_response_to_responses_api_response(
            payload["input"],
            params,  # type: ignore[arg-type]  # as above
            model_response(completion, model),
        ).model_dump(mode="json")
        usage = completion.usage
        response["usage"] = {  # the counts the model reported, in the shape Codex reads
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.total,
        }
        if payload.get("stream"):
            return stream(request, responses_events(response))
        return send(request, 200, response)

    def tool(self, request: BaseHTTPRequestHandler, payload: Dict[str, Any]) -> None:
        """A kbsweep tool: the built-in loop's own tool call, so the same grader, limits and output."""
        name = payload.get("name")
        if name not in SERVED:
            return send(request, 200, {"output": f"error: unknown tool {name!r}", "outcome": None})
        output = self.toolbox.call(name, json.dumps(payload.get("arguments") or {}))
        if name not in GRADING_TOOLS:
            return send(request, 200, {"output": output, "outcome": None})
        with self.calls:
            note_grade(self.result, self.toolbox.last_grade)
        send(request, 200, {"output": output, "outcome": (self.toolbox.last_grade or {}).get("outcome")})

    def answered(self, items: Any) -> None:
        """The tool results a Responses request carries for calls of earlier turns, as ``tool`` events of ``turns``."""
        for item in items if isinstance(items, list) else []:
            call = self.pending.pop(item.get("call_id"), None) if item.get("type") == "function_call_output" else None
            if call is None:
                continue
            output = item.get("output")
            content = output if isinstance(output, str) else "\n".join(part.get("text", "") for part in output or [])
            self.turns.append((time.time(), "tool", {**call, "content": content}))

    def said(self, completion: Completion) -> None:
        """A Responses turn as an ``assistant`` event of ``turns``; its calls wait for their results."""
        message = completion.message
        calls = message.get("tool_calls") or []
        self.turns.append(
            (
                time.time(),
                "assistant",
                {
                    "content": message.get("content"),
                    "tool_calls": calls,
                    "reasoning": completion.reasoning,
                    "usage": vars(completion.usage),
                    "cost_usd": completion.cost_usd,
                    "latency_s": completion.latency_s,
                    "finish_reason": completion.finish_reason,
                },
            )
        )
        for call in calls:
            self.pending[call["id"]] = {
                "name": call["function"]["name"],
                "tool_call_id": call["id"],
                "arguments": call["function"]["arguments"],
            }

    def refuse(self, request: BaseHTTPRequestHandler, path: str, refused: Refused) -> None:
        """An error in the wire shape of the request, so the harness reads it as its provider's."""
        if path.endswith("/messages"):
            kind = "invalid_request_error" if refused.overflow else "api_error"
            body = {"type": "error", "error": {"type": kind, "message": str(refused)}}
        else:
            body = {
                "error": {
                    "type": "server_error",
                    "code": "context_length_exceeded" if refused.overflow else None,
                    "message": str(refused),
                }
            }
        send(request, refused.status, body)

    # ---------------------------------------------------------------------------------------------- the model
    def complete(self, messages: List[Dict[str, Any]], tools: List[Dict[str, Any]]) -> Completion:
        """One model call under the cell's budgets; a spent budget or a provider fault ends the run."""
        with self.calls:
            if self.ended.is_set():
                raise Refused(503, f"kbsweep: the run has ended ({self.result.stop_reason.value})")
            stop = budget_stop(self.result, self.budgets, self.started)
            if stop:
                self.end(stop)
                raise Refused(
                    429 if stop != StopReason.WALL_CLOCK else 503, f"kbsweep: {stop.value}: the run's budget is spent"
                )
            deadline = self.started + self.budgets.wall_s
            try:
                completion = self.model.complete(messages, tools, deadline=deadline)
            except ContextOverflow as overflow:  # the harness compacts its own context
                raise Refused(400, f"prompt is too long: {overflow}", overflow=True) from None
            except ProviderFault as fault:
                self.note("error", outcome=fault.outcome.value, message=str(fault))
                self.result.usage.add(fault.usage)  # what the failed attempts were billed
                self.result.cost_usd += fault.cost_usd
                if time.monotonic() >= deadline:
                    self.end(StopReason.WALL_CLOCK)
                else:
                    self.result.fault = {"outcome": fault.outcome.value, "message": str(fault)}
                    self.end(StopReason.PROVIDER_FAULT)
                raise Refused(503, str(fault)) from None
            finally:
                for retry in getattr(self.model, "last_retries", None) or []:
                    self.note("retry", **retry)
            self.result.turns += 1
            self.result.usage.add(completion.usage)
            self.result.cost_usd += completion.cost_usd
            return completion

    def end(self, reason: StopReason) -> None:
        self.result.stop_reason = reason
        self.ended.set()

    def note(self, kind: str, **fields: Any) -> None:
        self.events.append((time.time(), kind, fields))


def send(request: BaseHTTPRequestHandler, status: int, body: Dict[str, Any]) -> None:
    data = json.dumps(body, default=str).encode()
    request.send_response(status)
    request.send_header("content-type", "application/json")
    request.send_header("content-length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)


def stream(request: BaseHTTPRequestHandler, events: Iterable[Tuple[str, Dict[str, Any]]]) -> None:
    """Server-sent events, sent at once: the model's answer is whole by the time the proxy has it."""
    data = b"".join(f"event: {name}\ndata: {json.dumps(event, default=str)}\n\n".encode() for name, event in events)
    request.send_response(200)
    request.send_header("content-type", "text/event-stream")
    request.send_header("cache-control", "no-cache")
    request.send_header("content-length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)
