"""The litellm-backed chat model: one provider call per turn, with retries (:mod:`kbsweep.agent.retries`), cost
and prompt caching.

litellm is imported lazily (it takes seconds to import), inside :meth:`LiteLLMModel.complete` and the price
registration, never at module import time.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from kbsweep.agent.models import Completion, ContextOverflow, ProviderFault, Usage
from kbsweep.agent.retries import (
    UNREACHABLE_ATTEMPTS,
    UNREACHABLE_WAIT_S,
    MalformedResponse,
    RetryPolicy,
    classify_exception,
    config_value,
    is_provider_exception,
    one_line,
    provider_answer,
    retry_after_seconds,
    status_of,
    unreachable,
)
from kbsweep.outcomes import Outcome

log = logging.getLogger(__name__)

# litellm's prompt-caching rule (its cache_control_injection_points): the system message, so tools + system prompt are
# cached across turns, and the last message, so each turn reads the previous turn's prefix (the conversation only grows)
CACHE_POINTS = [{"location": "message", "role": "system"}, {"location": "message", "index": -1}]
_COST_KEYS = (
    "input_cost_per_token",
    "output_cost_per_token",
    "cache_read_input_token_cost",
    "cache_creation_input_token_cost",
)


# ---------------------------------------------------------------------------------------------- config helpers
def _plain(value: Any) -> Any:
    """An OmegaConf container (or anything else) as plain Python data."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        value = obj.get(name, default)
    else:
        value = getattr(obj, name, default)
    return default if value is None else value


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _is_anthropic_route(route: str) -> bool:
    provider, _, model = route.partition("/")
    if provider == "anthropic":
        return True
    return provider in {"bedrock", "vertex_ai"} and "claude" in model.lower()


class LiteLLMModel:
    """A :class:`~kbsweep.agent.models.ChatModel` that calls ``litellm.completion``.

    ``config`` is a model config mapping (OmegaConf DictConfig or dict) with ``name``, ``route``, ``api_key_env``,
    ``api_base``, ``context_window``, ``max_output_tokens``, ``reasoning_effort``, ``prices`` (USD per million
    tokens: ``input``, ``output``, ``cache_read``, ``cache_write``), ``options`` (extra ``litellm.completion``
    kwargs), ``timeout_s`` and ``retry`` (``max_attempts``, ``base_delay_s``, ``max_delay_s``, ``budget_s``).

    * **Key**: read from ``os.environ[api_key_env]`` at every call and never kept on the object. With
      ``api_key_env`` null and an ``api_base`` set (a local server) the key ``"EMPTY"`` is sent; with neither,
      litellm's own provider env vars apply. A named but unset env var is an AUTHENTICATION fault.
    * **Cost**: when ``prices.input`` and ``prices.output`` are set, the prices are registered with
      ``litellm.register_model`` under ``route`` (``cache_read``/``cache_write`` default to the input price) and
      each call's cost is ``litellm.completion_cost`` (cache reads at the cache-read price, cache writes at the
      cache-write price). Otherwise ``prices_known`` is False and every cost is 0.0.
    * **Prompt caching** (``prompt_caching: true`` in the model YAML, for providers with an explicit prompt cache):
      litellm's ``cache_control_injection_points`` (:data:`CACHE_POINTS`) mark the system message and the last
      message, in the provider's own wire shape (litellm drops them for providers without explicit caching).
      Without it, messages are sent unchanged (OpenAI-style providers cache prefixes automatically).
    * **Retries**: litellm is called with ``num_retries=0``/``max_retries=0``; this class retries 429 (not
      credit/quota 429s), 408/409/425, 5xx, timeouts and connection errors (which litellm may raise as
      ``InternalServerError``) under :class:`RetryPolicy`, sleeping with the injectable ``sleep``; a host that does not
      resolve or refuses the connection gets one retry a second later, then a fault saying so (:func:`unreachable`). Each retry
      is logged (a warning, or at debug level when ``on_retry`` is given: the caller reports it), passed to
      ``on_retry`` (a dict: attempt, error, status, delay_s, ...) and kept in ``last_retries``.
    * **Faults**: a call that fails for good raises :class:`ProviderFault` with an outcome from
      :func:`classify_exception`, the last status, the provider's answer and the attempts made; a context-window
      error raises :class:`ContextOverflow` at once. Non-provider exceptions (bugs) propagate unchanged.
    * **Billed failures**: a garbled reply (tool-call arguments that are not JSON, no choices) carries usage the
      provider charges for: its tokens and cost are in its retry record, then in the answer's ``Completion``
      (``failed_usage``) or the fault's ``usage``/``cost_usd``, so a cell's totals count them.
    * **Messages**: the reply is an OpenAI-format assistant message; tool-call ``arguments`` is always a string,
      kept raw when it is not valid JSON. On Anthropic routes the message also carries ``thinking_blocks`` when
      the model returned any, since Anthropic requires them back on a tool-use turn with extended thinking.
    """

    def __init__(
        self,
        config: Any,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        on_retry: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.name: str = str(config_value(config, "name") or config_value(config, "route") or "model")
        route = config_value(config, "route")
        if not route:
            raise ValueError(f"model {self.name!r}: 'route' (a litellm model string) is required")
        self.route: str = str(route)
        self.api_key_env: str | None = config_value(config, "api_key_env")
        self.api_base: str | None = config_value(config, "api_base")
        self.context_window: int = int(config_value(config, "context_window", 200_000))
        self.max_output_tokens: int = int(config_value(config, "max_output_tokens", 32_000))
        self.reasoning_effort: str | None = config_value(config, "reasoning_effort")
        self.timeout_s: float = float(config_value(config, "timeout_s", 600.0))
        self.options: dict[str, Any] = dict(_plain(config_value(config, "options", {})) or {})
        self.retry = RetryPolicy.from_config(config_value(config, "retry"))
        prices = _plain(config_value(config, "prices", {})) or {}
        self.prices: dict[str, float | None] = {
            k: (float(prices[k]) if prices.get(k) is not None else None)
            for k in ("input", "output", "cache_read", "cache_write")
        }
        self.prices_known: bool = self.prices["input"] is not None and self.prices["output"] is not None
        self.prompt_caching: bool = bool(config_value(config, "prompt_caching", False))
        self.anthropic: bool = _is_anthropic_route(self.route)
        self._sleep = sleep
        self._clock = clock
        self._rng = rng or random.Random()
        self._on_retry = on_retry
        self.last_retries: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return f"LiteLLMModel(name={self.name!r}, route={self.route!r}, api_base={self.api_base!r})"

    __str__ = __repr__

    # ------------------------------------------------------------------------------------------------ prices
    def _price_entry(self) -> dict[str, Any]:
        per_token = {k: (v / 1e6 if v is not None else None) for k, v in self.prices.items()}
        provider = self.route.split("/", 1)[0] if "/" in self.route else "openai"
        return {
            "input_cost_per_token": per_token["input"],
            "output_cost_per_token": per_token["output"],
            "cache_read_input_token_cost": per_token["cache_read"]
            if per_token["cache_read"] is not None
            else per_token["input"],
            "cache_creation_input_token_cost": per_token["cache_write"]
            if per_token["cache_write"] is not None
            else per_token["input"],
            "litellm_provider": provider,
            "mode": "chat",
            "max_input_tokens": self.context_window,
            "max_output_tokens": self.max_output_tokens,
            "max_tokens": self.max_output_tokens,
            "supports_function_calling": True,
        }

    def register_prices(self) -> None:
        """Register this model's prices over litellm's table under ``route`` (a no-op when prices are unknown).

        litellm's table is process-global: before each cost computation the entry is checked and registered again
        if another model object registered the same route with other prices."""
        if not self.prices_known:
            return
        import litellm

        entry = self._price_entry()
        current = litellm.model_cost.get(self.route) or {}
        if all(current.get(k) == entry[k] for k in _COST_KEYS):
            return
        litellm.register_model({self.route: entry})

    def _cost(self, response: Any, usage: Usage) -> float:
        if not self.prices_known:
            return 0.0
        import litellm

        self.register_prices()
        try:
            return float(litellm.completion_cost(completion_response=response, model=self.route))
        except Exception as exc:  # noqa: BLE001 - fall back to our own arithmetic, never lose a turn over cost
            log.warning("litellm.completion_cost failed for %s (%s); using the model YAML prices", self.route, exc)
            p = self.prices
            input_price, output_price = p["input"], p["output"]
            assert input_price is not None and output_price is not None  # prices_known
            cache_read = p["cache_read"] if p["cache_read"] is not None else input_price
            cache_write = p["cache_write"] if p["cache_write"] is not None else input_price
            fresh = max(0, usage.input_tokens - usage.cached_tokens - usage.cache_write_tokens)
            return (
                fresh * input_price
                + usage.cached_tokens * cache_read
                + usage.cache_write_tokens * cache_write
                + usage.output_tokens * output_price
            ) / 1e6

    # ------------------------------------------------------------------------------------------------ call
    def _api_key(self) -> str | None:
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise ProviderFault(
                    Outcome.AUTHENTICATION, f"{self.name}: environment variable {self.api_key_env} is not set"
                )
            return key
        return "EMPTY" if self.api_base else None

    def _kwargs(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"max_tokens": self.max_output_tokens}
        kwargs.update(copy.deepcopy(self.options))
        kwargs.update(
            model=self.route,
            messages=[dict(m) for m in messages],
            timeout=self.timeout_s,
            num_retries=0,
            max_retries=0,
        )
        if self.prompt_caching:
            kwargs["cache_control_injection_points"] = copy.deepcopy(CACHE_POINTS)
        if tools:
            kwargs["tools"] = tools
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self.reasoning_effort:
            kwargs["reasoning_effort"] = self.reasoning_effort
        return kwargs

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], deadline: float | None = None
    ) -> Completion:
        """One assistant turn. With a ``deadline`` (a ``clock`` instant) each attempt's timeout is cut to the time
        left (at least 1 s) and no retry wait runs past it."""
        import litellm

        litellm.suppress_debug_info = True
        self.register_prices()
        kwargs = self._kwargs(messages, tools)
        self.last_retries = []
        spent = 0.0
        failed, failed_usd = Usage(), 0.0  # what the garbled replies retried so far were billed
        attempt = 0
        while True:
            attempt += 1
            api_key = self._api_key()
            started = self._clock()
            if deadline is not None:
                kwargs["timeout"] = min(self.timeout_s, max(1.0, deadline - started))
            try:
                if api_key is not None:
                    response = litellm.completion(api_key=api_key, **kwargs)
                else:
                    response = litellm.completion(**kwargs)
                completion = self._to_completion(response, self._clock() - started)
            except Exception as exc:  # noqa: BLE001 - classified below; bugs are re-raised
                elapsed = self._clock() - started
                spent += elapsed
                if isinstance(exc, ProviderFault):
                    raise
                if not isinstance(exc, MalformedResponse) and not is_provider_exception(exc):
                    raise
                billed = getattr(exc, "usage", None) or Usage()
                failed.add(billed)
                failed_usd += getattr(exc, "cost_usd", 0.0)
                outcome, retryable, overflow = classify_exception(exc)
                gone = unreachable(exc)  # no provider answered: no status, no litellm text, one quick retry
                message = f"{self.name}: {gone or one_line(exc)}"
                details: dict[str, Any] = {  # ProviderFault's keyword arguments
                    "status": None if gone else status_of(exc),
                    "answer": gone or provider_answer(one_line(exc)),
                    "attempts": attempt,
                    "usage": failed,
                    "cost_usd": failed_usd,
                    "reached": not gone,
                }
                limit = UNREACHABLE_ATTEMPTS if gone else self.retry.max_attempts
                if overflow:
                    raise ContextOverflow(message, **details) from exc
                if not retryable:
                    raise ProviderFault(outcome, message, **details) from exc
                if attempt >= limit:
                    raise ProviderFault(outcome, f"{message} (after {attempt} attempts)", **details) from exc
                wait = retry_after_seconds(exc)
                source = "retry-after"
                if wait is None:
                    wait = (
                        self.retry.backoff(attempt, self._rng)
                        if not gone
                        else min(UNREACHABLE_WAIT_S, self.retry.backoff(attempt, self._rng))
                    )
                    source = "backoff"
                if spent + wait > self.retry.budget_s:
                    raise ProviderFault(
                        outcome,
                        f"{message} (retry budget {self.retry.budget_s:g}s spent: {spent:.1f}s used, "
                        f"next wait {wait:.1f}s, {attempt} attempts)",
                        **details,
                    ) from exc
                if deadline is not None and self._clock() + wait > deadline:
                    raise ProviderFault(
                        outcome, f"{message} (no time left for a retry, {attempt} attempts)", **details
                    ) from exc
                record = {
                    "attempt": attempt,
                    "error": type(exc).__name__,
                    "status": details["status"],
                    "outcome": outcome.value,
                    "delay_s": wait,
                    "delay_source": source,
                    "message": gone or one_line(exc, 200),
                    "max_attempts": limit,
                    "usage": vars(billed),
                    "cost_usd": getattr(exc, "cost_usd", 0.0),
                }
                self.last_retries.append(record)
                log.log(
                    logging.WARNING
                    if self._on_retry is None
                    else logging.DEBUG,  # an on_retry caller reports it its own way
                    "%s: attempt %d/%d failed (%s, status %s); retrying in %.2fs (%s)",
                    self.name,
                    attempt,
                    limit,
                    record["error"],
                    record["status"],
                    wait,
                    source,
                )
                if self._on_retry is not None:
                    self._on_retry(record)
                self._sleep(wait)
                spent += wait
            else:
                completion.usage.add(failed)
                completion.cost_usd += failed_usd
                completion.failed_usage = failed
                return completion

    # ------------------------------------------------------------------------------------------------ parsing
    def _to_completion(self, response: Any, latency: float) -> Completion:
        usage = usage_of(response)
        cost = self._cost(response, usage)
        try:
            message, choice = self._message(response)
        except MalformedResponse as garbled:  # the provider bills a garbled reply as any other
            garbled.usage, garbled.cost_usd = usage, cost
            raise
        return Completion(
            message=message,
            usage=usage,
            cost_usd=cost,
            latency_s=latency,
            finish_reason=str(_field(choice, "finish_reason", "stop")),
            reasoning=_field(_field(choice, "message"), "reasoning_content") or None,
        )

    def _message(self, response: Any) -> tuple[dict[str, Any], Any]:
        """The reply's assistant message (OpenAI format) and the choice it came from; MalformedResponse when the
        reply has none or its tool-call arguments are not a JSON object."""
        choices = _field(response, "choices", [])
        if not choices:
            raise MalformedResponse("response has no choices")
        choice = choices[0]
        msg = _field(choice, "message")
        message: dict[str, Any] = {"role": "assistant", "content": _field(msg, "content")}
        calls = []
        for call in _field(msg, "tool_calls", []) or []:
            function = _field(call, "function")
            arguments = _field(function, "arguments")
            if arguments is None or arguments == "":
                arguments = "{}"
            elif not isinstance(arguments, str):
                try:
                    arguments = json.dumps(arguments)
                except (TypeError, ValueError):
                    arguments = str(arguments)
            if not is_json_object(arguments):
                raise MalformedResponse(
                    f"tool call {_field(function, 'name', '')!r} has arguments that are not a JSON object"
                )
            calls.append(
                {
                    "id": _field(call, "id") or f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": _field(function, "name", ""), "arguments": arguments},
                }
            )
        if calls:
            message["tool_calls"] = calls
        thinking = _field(msg, "thinking_blocks")
        if self.anthropic and thinking:
            message["thinking_blocks"] = [dict(b) if isinstance(b, Mapping) else b for b in thinking]
        return message, choice


def usage_of(response: Any) -> Usage:
    """A reply's token counts, in the OpenAI convention litellm gives every provider's."""
    usage_obj = _field(response, "usage")
    prompt_details = _field(usage_obj, "prompt_tokens_details")
    completion_details = _field(usage_obj, "completion_tokens_details")
    return Usage(
        input_tokens=_int(_field(usage_obj, "prompt_tokens")),
        output_tokens=_int(_field(usage_obj, "completion_tokens")),
        cached_tokens=_int(_field(prompt_details, "cached_tokens") or _field(usage_obj, "cache_read_input_tokens")),
        cache_write_tokens=_int(
            _field(usage_obj, "cache_creation_input_tokens")
            or _field(prompt_details, "cache_creation_tokens")
            or _field(prompt_details, "cache_write_tokens")
        ),
        reasoning_tokens=_int(_field(completion_details, "reasoning_tokens")),
    )
