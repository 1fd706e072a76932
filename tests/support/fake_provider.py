"""A scripted, local LLM provider for tests: OpenAI chat completions and Anthropic Messages over real HTTP.

Usage::

    with FakeProvider([Reply(content="hi", prompt_tokens=10, completion_tokens=2)]) as fp:
        litellm.completion(model="openai/local", api_base=fp.base_url, api_key="sk-x", messages=...)
        fp.requests[0].json["messages"]      # what the client sent
        fp.requests[0].headers["authorization"]

The server is a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 with an ephemeral port, run in a daemon thread.
It speaks two wire shapes, picked by the request path:

* ``POST <base>/v1/chat/completions``: OpenAI chat completions (``fp.base_url`` is ``http://127.0.0.1:PORT/v1``).
* ``POST <base>/v1/messages``: Anthropic Messages (``fp.anthropic_base_url`` is ``http://127.0.0.1:PORT``).

A *script* is a sequence of steps consumed one per request, in order; a mapping from the request's ``model`` to
such a sequence (one server for several model YAMLs); or a callable ``(request_json) -> step`` (``request_json`` is
the parsed body; the callable may also take a second argument, the :class:`Request`). A plain ``str`` step is
shorthand for ``Reply(content=str)``. Steps:

* :class:`Reply`: an assistant turn (text, tool calls, reasoning, usage numbers).
* :class:`HttpError`: an HTTP error status with a JSON (or text) body and optional ``Retry-After``.
* :class:`Delay`: sleep N seconds, then perform another step (default: a plain reply); triggers client timeouts.
* :class:`MalformedToolCall`: a tool call whose ``arguments`` is not valid JSON (OpenAI shape only).
* :class:`ContextLengthError`: the provider's 400 "context too long" error, in the wire shape of the request.
* :class:`Disconnect`: close the socket without sending a response.

Everything is bounded: a request after the script is exhausted, or beyond ``max_requests``, gets a 500 with a
``fake provider: ...`` message (and is recorded); request bodies above ``max_body_bytes`` are refused with 413;
delays are interrupted when the server stops.
"""

from __future__ import annotations

import inspect
import itertools
import json
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Union

__all__ = [
    "ContextLengthError",
    "Delay",
    "Disconnect",
    "FakeProvider",
    "HttpError",
    "MalformedToolCall",
    "Reply",
    "Request",
    "Step",
    "ToolCall",
    "OPENAI_CONTEXT_LENGTH_BODY",
    "ANTHROPIC_CONTEXT_LENGTH_BODY",
]


# --------------------------------------------------------------------------------------------------------- steps
@dataclass
class ToolCall:
    """One tool call of a :class:`Reply`. ``arguments`` is a dict (sent as JSON) or a raw string (sent as is)."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass
class Reply:
    """An assistant turn.

    Usage follows the OpenAI convention: ``prompt_tokens`` counts *all* input tokens, of which ``cached_tokens``
    were cache reads and ``cache_write_tokens`` cache writes. In the Anthropic shape the server converts this to
    Anthropic's disjoint counts (``input_tokens = prompt - cached - cache_write``, ``cache_read_input_tokens``,
    ``cache_creation_input_tokens``). ``finish_reason`` defaults to ``tool_calls`` when there are tool calls,
    else ``stop`` (``tool_use`` / ``end_turn`` in the Anthropic shape). ``tool_calls`` items may be
    :class:`ToolCall` or ``(name, arguments)`` tuples.
    """

    content: str | None = None
    tool_calls: Sequence[ToolCall | tuple[str, Any]] = ()
    prompt_tokens: int = 10
    completion_tokens: int = 5
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    reasoning_content: str | None = None
    finish_reason: str | None = None
    model: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass
class HttpError:
    """An HTTP error response. ``body`` is a dict (sent as JSON) or str; ``None`` gives a standard error body of
    the request's wire shape. ``retry_after`` (seconds, or an HTTP date string) sets the ``Retry-After`` header."""

    status: int
    body: dict[str, Any] | str | None = None
    retry_after: float | int | str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Delay:
    """Sleep ``seconds`` (interruptible by server stop), then perform ``then`` (default: ``Reply("late")``)."""

    seconds: float
    then: "Step | None" = None


@dataclass
class MalformedToolCall:
    """A reply with one tool call whose ``arguments`` string is not valid JSON (OpenAI shape; in the Anthropic
    shape ``input`` must be an object, so the raw string is sent as ``input`` anyway, which clients may reject)."""

    name: str = "write_file"
    raw_arguments: str = '{"path": "kernel.py", "content": "unterminated'
    content: str | None = None
    prompt_tokens: int = 10
    completion_tokens: int = 5


@dataclass
class ContextLengthError:
    """The 400 error a provider sends when the prompt is longer than the context window."""

    body: dict[str, Any] | None = None  # None: the standard body of the request's wire shape


@dataclass
class Disconnect:
    """Close the connection without sending any response bytes."""


Step = Union[Reply, HttpError, Delay, MalformedToolCall, ContextLengthError, Disconnect, str]


OPENAI_CONTEXT_LENGTH_BODY: dict[str, Any] = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in "
        "9000 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}

ANTHROPIC_CONTEXT_LENGTH_BODY: dict[str, Any] = {
    "type": "error",
    "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"},
}


# ------------------------------------------------------------------------------------------------------ requests
@dataclass
class Request:
    """One recorded request. ``headers`` keys are lower-cased. ``json`` is None when the body was not JSON."""

    index: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    step: Any = None  # the step that answered it (after resolving callables and Delay.then)

    @property
    def shape(self) -> str:
        return "anthropic" if self.path.rstrip("/").endswith("/messages") else "openai"


_STATUS_TYPES_OPENAI = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_exceeded",
}
_STATUS_TYPES_ANTHROPIC = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def _default_error_body(status: int, shape: str, message: str | None = None) -> dict[str, Any]:
    message = message or f"fake provider error {status}"
    if shape == "anthropic":
        return {
            "type": "error",
            "error": {"type": _STATUS_TYPES_ANTHROPIC.get(status, "api_error"), "message": message},
        }
    return {
        "error": {
            "message": message,
            "type": _STATUS_TYPES_OPENAI.get(status, "server_error"),
            "param": None,
            "code": None,
        }
    }


# -------------------------------------------------------------------------------------------------------- server
class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    provider: "FakeProvider"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # one request per connection: no stale keep-alive sockets between tests

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr logging
        pass

    def do_GET(self) -> None:  # noqa: N802
        self._send_json(404, {"error": {"message": f"fake provider: no GET {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:  # noqa: N802
        fp = self.server.provider
        length = int(self.headers.get("Content-Length") or 0)
        if length > fp.max_body_bytes:
            self._send_json(
                413, {"error": {"message": "fake provider: body too large", "type": "invalid_request_error"}}
            )
            return
        body = self.rfile.read(length) if length else b""
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        request = fp._record(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body, parsed)
        path = self.path.split("?", 1)[0].rstrip("/")
        if not (path.endswith("/chat/completions") or path.endswith("/messages")):
            self._send_json(404, _default_error_body(404, "openai", f"fake provider: no route {self.path}"))
            return
        step = fp._next_step(request)
        try:
            self._perform(step, request, depth=0)
        except (BrokenPipeError, ConnectionResetError, socket.timeout, OSError):
            pass  # the client went away (e.g. it timed out during a Delay)

    # ------------------------------------------------------------------------------------------------ steps
    def _perform(self, step: Any, request: Request, depth: int) -> None:
        fp = self.server.provider
        if isinstance(step, str):
            step = Reply(content=step)
        if depth > 8:
            step = HttpError(500, body=_default_error_body(500, request.shape, "fake provider: Delay nesting too deep"))
        request.step = step
        shape = request.shape
        if isinstance(step, Delay):
            if fp._stopping.wait(max(0.0, float(step.seconds))):
                self._drop()
                return
            self._perform(step.then if step.then is not None else Reply(content="late"), request, depth + 1)
        elif isinstance(step, Reply):
            self._send_json(200, _render_reply(step, request), step.headers)
        elif isinstance(step, MalformedToolCall):
            reply = Reply(
                content=step.content,
                tool_calls=[ToolCall(step.name, step.raw_arguments)],
                prompt_tokens=step.prompt_tokens,
                completion_tokens=step.completion_tokens,
            )
            self._send_json(200, _render_reply(reply, request))
        elif isinstance(step, HttpError):
            headers = dict(step.headers)
            if step.retry_after is not None:
                headers["Retry-After"] = str(step.retry_after)
            body = step.body if step.body is not None else _default_error_body(step.status, shape)
            self._send_json(step.status, body, headers)
        elif isinstance(step, ContextLengthError):
            body = step.body or (ANTHROPIC_CONTEXT_LENGTH_BODY if shape == "anthropic" else OPENAI_CONTEXT_LENGTH_BODY)
            self._send_json(400, body)
        elif isinstance(step, Disconnect):
            self._drop()
        else:
            msg = f"fake provider: unknown step {type(step).__name__}"
            self._send_json(500, _default_error_body(500, shape, msg))

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.connection.close()

    def _send_json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


def _tool_calls(reply: Reply, index: int) -> list[tuple[str, str, Any]]:
    out = []
    for i, call in enumerate(reply.tool_calls):
        if not isinstance(call, ToolCall):
            name, args = call
            call = ToolCall(name, args)
        out.append((call.id or f"call_{index}_{i}", call.name, call.arguments))
    return out


def _render_reply(reply: Reply, request: Request) -> dict[str, Any]:
    req = request.json if isinstance(request.json, dict) else {}
    model = reply.model or req.get("model") or "fake-model"
    calls = _tool_calls(reply, request.index)
    if request.shape == "anthropic":
        content: list[dict[str, Any]] = []
        if reply.reasoning_content is not None:
            content.append({"type": "thinking", "thinking": reply.reasoning_content, "signature": "fake-signature"})
        if reply.content is not None:
            content.append({"type": "text", "text": reply.content})
        for call_id, name, args in calls:
            call_id = call_id if call_id.startswith("toolu_") else "toolu_" + call_id
            content.append({"type": "tool_use", "id": call_id, "name": name, "input": args})
        stop = reply.finish_reason or ("tool_use" if calls else "end_turn")
        return {
            "id": f"msg_fake_{request.index}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": max(0, reply.prompt_tokens - reply.cached_tokens - reply.cache_write_tokens),
                "output_tokens": reply.completion_tokens,
                "cache_read_input_tokens": reply.cached_tokens,
                "cache_creation_input_tokens": reply.cache_write_tokens,
            },
        }
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning_content is not None:
        message["reasoning_content"] = reply.reasoning_content
    if calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
            for call_id, name, args in calls
        ]
    return {
        "id": f"chatcmpl-fake-{request.index}",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": reply.finish_reason or ("tool_calls" if calls else "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
        },
    }


# ------------------------------------------------------------------------------------------------------ provider
class FakeProvider:
    """A scripted provider on 127.0.0.1; use as a context manager (or ``start()`` / ``stop()``)."""

    def __init__(
        self,
        script: Sequence[Step] | Mapping[str, Sequence[Step]] | Callable[..., Step] = (),
        *,
        max_requests: int = 100,
        max_body_bytes: int = 16 * 1024 * 1024,
    ):
        self._script: Callable[..., Step] | None = script if callable(script) else None
        self._by_model: dict[str, list[Step]] | None = (
            {k: list(v) for k, v in script.items()} if isinstance(script, Mapping) else None
        )
        self._steps = list(script) if self._script is None and self._by_model is None else []
        self._callable_takes_request = False
        if self._script is not None:
            try:
                self._callable_takes_request = len(inspect.signature(self._script).parameters) >= 2
            except (TypeError, ValueError):
                pass
        self.max_requests = max_requests
        self.max_body_bytes = max_body_bytes
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------------- lifecycle
    def start(self) -> "FakeProvider":
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", 0), _Handler)
        server.provider = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-provider", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> "FakeProvider":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---------------------------------------------------------------------------------------------- access
    @property
    def port(self) -> int:
        assert self._server is not None, "FakeProvider not started"
        return self._server.server_address[1]

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL (``.../v1``); the client appends ``/chat/completions``."""
        return self.root_url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        """Anthropic-style base URL (the host root); the client appends ``/v1/messages``."""
        return self.root_url

    @property
    def remaining(self) -> int:
        """Scripted steps not yet consumed (0 for a callable script)."""
        with self._lock:
            return len(self._steps) + sum(len(v) for v in (self._by_model or {}).values())

    def add(self, *steps: Step, model: str | None = None) -> None:
        """Append steps to a list script (or to ``model``'s list of a mapping script)."""
        with self._lock:
            (self._by_model[model] if model is not None else self._steps).extend(steps)

    # ------------------------------------------------------------------------------------------- internals
    def _record(self, method: str, path: str, headers: dict[str, str], body: bytes, parsed: Any) -> Request:
        with self._lock:
            request = Request(next(self._counter), method, path, headers, body, parsed)
            self.requests.append(request)
            return request

    def _next_step(self, request: Request) -> Step:
        shape = request.shape
        if request.index >= self.max_requests:
            msg = f"fake provider: max_requests={self.max_requests} exceeded"
            return HttpError(500, body=_default_error_body(500, shape, msg))
        if self._script is not None:
            try:
                if self._callable_takes_request:
                    return self._script(request.json, request)
                return self._script(request.json)
            except Exception as exc:  # noqa: BLE001 - report script bugs to the client, do not hang
                return HttpError(500, body=_default_error_body(500, shape, f"fake provider: script raised {exc!r}"))
        with self._lock:
            steps = self._steps
            if self._by_model is not None:
                model = request.json.get("model") if isinstance(request.json, dict) else None
                steps = self._by_model.get(model, [])
            if not steps:
                return HttpError(500, body=_default_error_body(500, shape, "fake provider: script exhausted"))
            return steps.pop(0)
