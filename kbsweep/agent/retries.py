"""How a provider call fails and is retried: each exception classified (transient, context overflow, credits,
model not found, authentication), ``Retry-After`` honoured, and the retry policy of a model YAML's ``retry``."""

from __future__ import annotations

import email.utils
import json
import random
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kbsweep.outcomes import Outcome

_CREDIT_RE = re.compile(r"credit|quota|billing|insufficient|payment", re.I)


# stricter for 400/403: those statuses carry many unrelated errors
_CREDIT_STRICT_RE = re.compile(r"credit balance|billing|insufficient_quota|insufficient credits|payment required", re.I)


_MODEL_NOT_FOUND_RE = re.compile(
    r"model_not_found|model not found|no such model|unknown model|invalid model|model .{0,80} does not exist", re.I
)


_CONTEXT_RE = re.compile(
    r"context_length_exceeded|maximum context length|context window|prompt is too long|too many tokens", re.I
)


# a 400 that is none of the classified ones (context, credits, model) is the provider's own fault as often as not
_RETRYABLE_STATUSES = frozenset({400, 408, 409, 425, 429}) | frozenset(range(500, 600))


def config_value(cfg: Any, key: str, default: Any = None) -> Any:
    try:
        value = cfg[key]
    except (KeyError, AttributeError, TypeError):
        return default
    except Exception:  # omegaconf raises its own errors for missing keys in structured configs
        return default
    return default if value is None else value


@dataclass(frozen=True)
class RetryPolicy:
    """Retry rules of one model: at most ``max_attempts`` calls in all, within ``budget_s`` seconds (the time spent
    in the calls plus the waits between them). Waits are exponential with full jitter,
    ``uniform(0, min(max_delay_s, base_delay_s * 2**(n-1)))`` after the n-th failed attempt, unless the response
    carries ``Retry-After`` (or ``retry-after-ms``): that wait is honoured exactly, and if it would run past the
    budget the call gives up at once."""

    max_attempts: int = 6
    base_delay_s: float = 2.0
    max_delay_s: float = 120.0
    budget_s: float = 900.0

    @classmethod
    def from_config(cls, cfg: Any) -> "RetryPolicy":
        cfg = cfg if cfg is not None else {}
        d = cls()
        return cls(
            max_attempts=max(1, int(config_value(cfg, "max_attempts", d.max_attempts))),
            base_delay_s=float(config_value(cfg, "base_delay_s", d.base_delay_s)),
            max_delay_s=float(config_value(cfg, "max_delay_s", d.max_delay_s)),
            budget_s=float(config_value(cfg, "budget_s", d.budget_s)),
        )

    def backoff(self, failed_attempts: int, rng: random.Random) -> float:
        cap = min(self.max_delay_s, self.base_delay_s * (2 ** max(0, failed_attempts - 1)))
        return rng.uniform(0.0, max(0.0, cap))


# ------------------------------------------------------------------------------------------- error handling
def status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
    try:
        return int(status) if status is not None else None
    except (TypeError, ValueError):
        return None


def _headers_of(exc: BaseException) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for attr in ("litellm_response_headers", "headers"):
        headers = getattr(exc, attr, None)
        if headers:
            out.append(headers)
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers:
        out.append(headers)
    return out


def _header(headers: Mapping[str, Any], name: str) -> str | None:
    getter = getattr(headers, "get", None)
    if getter is not None:
        value = getter(name)
        if value is not None:
            return str(value)
    for key, value in dict(headers).items():
        if str(key).lower() == name:
            return str(value)
    return None


def retry_after_seconds(exc: BaseException, now: float | None = None) -> float | None:
    """Seconds the provider asked us to wait (``retry-after-ms``, or ``Retry-After`` in seconds or as an HTTP
    date), or None when it did not say."""
    for headers in _headers_of(exc):
        try:
            ms = _header(headers, "retry-after-ms")
            if ms is not None:
                return max(0.0, float(ms) / 1000.0)
        except (TypeError, ValueError):
            pass
        value = _header(headers, "retry-after")
        if value is None:
            continue
        value = value.strip()
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            continue
        if when is None:
            continue
        return max(0.0, when.timestamp() - (time.time() if now is None else now))
    return None


_HINT_RE = re.compile(r"\s*Handle with `[^`]*`\.?")  # litellm's advice to its caller, no part of any answer

UNREACHABLE_ATTEMPTS = 2  # calls to a host that does not resolve or refuses connections: one quick retry, then a fault
UNREACHABLE_WAIT_S = 1.0  # the wait before that retry, at most

_NOT_RESOLVED_RE = re.compile(
    r"Name or service not known|nodename nor servname|Temporary failure in name resolution|getaddrinfo failed|"
    r"No address associated with hostname",
    re.I,
)
_REFUSED_RE = re.compile(r"Connection refused|Errno 111\b|ECONNREFUSED", re.I)


def causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and all(link is not seen for seen in chain):
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


def _requested_host(exc: BaseException) -> str | None:
    """The host an httpx or openai connection error was sending to (litellm's own exceptions carry a made-up
    request: never theirs)."""
    if (type(exc).__module__ or "").split(".")[0] not in ("httpx", "openai"):
        return None
    try:
        url = exc.request.url  # type: ignore[attr-defined]
        return f"{url.host}:{url.port}" if url.host and url.port else url.host or None
    except Exception:  # noqa: BLE001 - httpx raises RuntimeError for an error without a request
        return None


def unreachable(exc: BaseException) -> str | None:
    """``cannot reach <host>: name not resolved`` (or ``connection refused``) when a call never reached a provider,
    else None. litellm reports both as its ``InternalServerError`` with a status 500 no server sent; the cause
    chain holds the socket's own error and the request's host."""
    chain = causes(exc)
    why = None
    for error in chain:
        # the text only of a connection's own errors (httpx's ConnectError, openai's APIConnectionError): a gateway's
        # answer may quote an upstream's refusal, and that is an answer
        text = str(error) if isinstance(error, OSError) or "Connect" in type(error).__name__ else ""
        if isinstance(error, socket.gaierror) or _NOT_RESOLVED_RE.search(text):
            why = "name not resolved"
        elif isinstance(error, ConnectionRefusedError) or _REFUSED_RE.search(text):
            why = "connection refused"
        if why:
            break
    if why is None:
        return None
    host = next((h for h in map(_requested_host, reversed(chain)) if h), None)
    return f"cannot reach {host or 'the provider'}: {why}"


def one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(_HINT_RE.sub("", str(exc)).split()) or type(exc).__name__
    text = text.replace("litellm.", "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def provider_answer(text: str) -> str:
    """What the provider said, from an error's :func:`one_line`, without litellm's ``<Type>: <Provider>Exception - ``."""
    _, wrapped, said = text.partition("Exception - ")
    return said if wrapped and said else text


def is_provider_exception(exc: BaseException) -> bool:
    if isinstance(exc, (OSError, TimeoutError)):
        return True
    for klass in type(exc).__mro__:
        module = klass.__module__ or ""
        if module.split(".")[0] in {"litellm", "openai", "httpx", "httpcore", "anthropic", "aiohttp", "requests"}:
            return True
    return False


def classify_exception(exc: BaseException) -> tuple[Outcome, bool, bool]:
    """``(outcome, retryable, context_overflow)`` for an exception raised by a provider call.

    429 → RATE_LIMITED (retryable); 402, or 429 whose text mentions credit/quota/billing/insufficient/payment →
    CREDITS_EXHAUSTED (also 400/403 with billing text); 404 or a model-not-found error → MODEL_NOT_FOUND;
    401/403 → AUTHENTICATION; context-window errors → context overflow (PROVIDER_ERROR); 408, 409, 425, 5xx,
    timeouts, connection errors and status-less API errors → PROVIDER_ERROR (retryable); any other status →
    PROVIDER_ERROR (not retried).
    """
    import_ok = True
    try:
        import litellm
    except ImportError:  # pragma: no cover
        import_ok = False
    status = status_of(exc)
    text = str(exc)
    body = getattr(exc, "body", None)
    if body:
        try:
            text += " " + json.dumps(body)
        except (TypeError, ValueError):
            text += " " + str(body)

    if import_ok and isinstance(exc, litellm.ContextWindowExceededError):
        return Outcome.PROVIDER_ERROR, False, True
    if status in (400, 413) and _CONTEXT_RE.search(text):
        return Outcome.PROVIDER_ERROR, False, True
    if status == 402 or (status == 429 and _CREDIT_RE.search(text)):
        return Outcome.CREDITS_EXHAUSTED, False, False
    if status in (400, 403) and _CREDIT_STRICT_RE.search(text):
        return Outcome.CREDITS_EXHAUSTED, False, False
    if status == 429:
        return Outcome.RATE_LIMITED, True, False
    if (import_ok and isinstance(exc, litellm.NotFoundError)) or status == 404:
        return Outcome.MODEL_NOT_FOUND, False, False
    if status in (400, 422) and _MODEL_NOT_FOUND_RE.search(text):
        return Outcome.MODEL_NOT_FOUND, False, False
    auth_types = (litellm.AuthenticationError, litellm.PermissionDeniedError) if import_ok else ()
    if status in (401, 403) or isinstance(exc, auth_types):
        return Outcome.AUTHENTICATION, False, False
    if import_ok and isinstance(exc, (litellm.Timeout, litellm.APIConnectionError)):
        return Outcome.PROVIDER_ERROR, True, False
    if status is None:
        # connection resets, undecodable bodies, status-less API errors: transient as far as we can tell
        return Outcome.PROVIDER_ERROR, True, False
    return Outcome.PROVIDER_ERROR, status in _RETRYABLE_STATUSES, False


# ---------------------------------------------------------------------------------------------- the model
class MalformedResponse(Exception):
    """A reply the provider garbled (no choices, tool-call arguments that are not JSON): its fault, not the
    model's; retried like a transient error, then a PROVIDER_ERROR. ``usage`` and ``cost_usd``: what the reply was
    billed all the same (None and 0.0 until the model has read them)."""

    usage: Any = None
    cost_usd: float = 0.0
