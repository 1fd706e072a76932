"""LiteLLMModel over real HTTP (through litellm) against the scripted fake provider, in both wire shapes."""

from __future__ import annotations

import email.utils
import json
import os
import random
import time
import urllib.error
import urllib.request

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from kbsweep.agent.llm import ContextOverflow, LiteLLMModel
from kbsweep.agent.models import ProviderFault
from kbsweep.agent.retries import retry_after_seconds
from kbsweep.outcomes import Outcome
from tests.support.fake_provider import (
    ContextLengthError,
    Delay,
    Disconnect,
    FakeProvider,
    HttpError,
    MalformedToolCall,
    Reply,
    ToolCall,
)

pytestmark = pytest.mark.fast

SHAPES = ["openai", "anthropic"]
KEY_ENV = "KBSWEEP_TEST_FAKE_KEY"
SECRET = "sk-test-4f1c9e-very-secret"
PRICES = {"input": 2.0, "output": 10.0, "cache_read": 0.2, "cache_write": 2.5}  # USD / 1M tokens
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file in the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "You write GPU kernels."},
    {"role": "user", "content": "Make the softmax fast."},
]


@pytest.fixture(autouse=True)
def _api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)


class Sleeps(list):
    """An injected sleep that records the waits instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def make_model(fp: FakeProvider, shape: str = "openai", sleeps: Sleeps | None = None, **overrides) -> LiteLLMModel:
    retry = {"max_attempts": 4, "base_delay_s": 1.0, "max_delay_s": 8.0, "budget_s": 120.0}
    retry.update(overrides.pop("retry", {}))
    config = {
        "name": f"fake-{shape}",
        "route": "openai/local-model" if shape == "openai" else "anthropic/claude-fake-4-8",
        "api_key_env": KEY_ENV,
        "api_base": fp.base_url if shape == "openai" else fp.anthropic_base_url,
        "context_window": 100_000,
        "max_output_tokens": 1024,
        "reasoning_effort": None,
        "prices": dict(PRICES),
        "options": {},
        "timeout_s": 5.0,
        "retry": retry,
        "prompt_caching": shape == "anthropic",
    }
    config.update(overrides)
    return LiteLLMModel(config, sleep=sleeps if sleeps is not None else Sleeps(), rng=random.Random(0))


def args_of(completion, i: int = 0) -> dict:
    return json.loads(completion.message["tool_calls"][i]["function"]["arguments"])


# ------------------------------------------------------------------------------------------------ replies
@pytest.mark.parametrize("shape", SHAPES)
def test_tool_call_parsing_and_request_shape(shape):
    step = Reply(
        content="Writing the kernel.",
        tool_calls=[ToolCall("write_file", {"path": "kernel.py", "content": "x = 1"}, id="call_abc")],
    )
    with FakeProvider([step]) as fp:
        completion = make_model(fp, shape).complete(MESSAGES, TOOLS)
    msg = completion.message
    assert msg["role"] == "assistant" and msg["content"] == "Writing the kernel."
    [call] = msg["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "write_file"
    assert call["id"].endswith("call_abc")
    assert isinstance(call["function"]["arguments"], str)
    assert args_of(completion) == {"path": "kernel.py", "content": "x = 1"}
    assert completion.finish_reason == "tool_calls"
    assert completion.latency_s > 0
    [req] = fp.requests
    body = req.json
    if shape == "openai":
        assert req.path == "/v1/chat/completions"
        assert body["model"] == "local-model"
        assert body["tools"][0]["function"]["name"] == "write_file"
        assert body["messages"][0] == {"role": "system", "content": "You write GPU kernels."}  # no cache markers
        assert body["max_tokens"] == 1024
    else:
        assert req.path == "/v1/messages"
        assert body["model"] == "claude-fake-4-8"
        assert body["tools"][0]["name"] == "write_file"
        # prompt-caching rule: system and last message carry cache_control
        assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
        assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert MESSAGES[0]["content"] == "You write GPU kernels."  # caller's messages untouched


@pytest.mark.parametrize("shape", SHAPES)
def test_multi_turn_exchange(shape):
    script = [
        Reply(tool_calls=[("write_file", {"path": "k.py", "content": "a"})], reasoning_content="Plan: tile it."),
        Reply(content="Done, submitted."),
    ]
    with FakeProvider(script) as fp:
        model = make_model(fp, shape)
        messages = [dict(m) for m in MESSAGES]
        first = model.complete(messages, TOOLS)
        assert first.reasoning == "Plan: tile it."
        messages.append(first.message)
        call_id = first.message["tool_calls"][0]["id"]
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "wrote k.py"})
        second = model.complete(messages, TOOLS)
    assert second.message == {"role": "assistant", "content": "Done, submitted."}
    assert second.finish_reason == "stop"
    assert len(fp.requests) == 2
    sent = fp.requests[1].json["messages"]
    if shape == "openai":
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
        assert sent[2]["tool_calls"][0]["id"] == call_id
        assert sent[3] == {"role": "tool", "tool_call_id": call_id, "content": "wrote k.py"}
    else:
        assert [m["role"] for m in sent] == ["user", "assistant", "user"]
        blocks = sent[1]["content"]
        assert blocks[0]["type"] == "thinking"  # thinking blocks go back to Anthropic on a tool-use turn
        assert blocks[-1] == {
            "type": "tool_use",
            "id": call_id,
            "name": "write_file",
            "input": {"path": "k.py", "content": "a"},
        }
        result = sent[2]["content"][0]
        assert result["type"] == "tool_result" and result["tool_use_id"] == call_id
        assert result["cache_control"] == {
            "type": "ephemeral"
        }  # last message marked (litellm marks its tool_result block)
        assert "cache_control" not in json.dumps(sent[0])  # the first user message is not (a system exists)
        assert fp.requests[1].json["system"][-1]["cache_control"] == {"type": "ephemeral"}


@pytest.mark.parametrize("shape", SHAPES)
def test_usage_and_cost_with_cache_reads(shape):
    step = Reply(
        content="ok",
        prompt_tokens=10_000,
        completion_tokens=2_000,
        cached_tokens=6_000,
        cache_write_tokens=1_000 if shape == "anthropic" else 0,
        reasoning_tokens=500,
    )
    with FakeProvider([step]) as fp:
        model = make_model(fp, shape)
        completion = model.complete(MESSAGES, TOOLS)
    usage = completion.usage
    assert model.prices_known
    assert usage.input_tokens == 10_000  # all prompt tokens, cached ones included
    assert usage.output_tokens == 2_000
    assert usage.cached_tokens == 6_000
    if shape == "openai":
        assert usage.reasoning_tokens == 500
        fresh, writes = 4_000, 0
    else:
        assert usage.cache_write_tokens == 1_000
        fresh, writes = 3_000, 1_000
    expected = (
        fresh * PRICES["input"]
        + 6_000 * PRICES["cache_read"]
        + writes * PRICES["cache_write"]
        + 2_000 * PRICES["output"]
    ) / 1e6
    assert completion.cost_usd == pytest.approx(expected, rel=1e-9)
    # cached tokens really are cheaper than if they had been billed as input
    assert completion.cost_usd < (10_000 * PRICES["input"] + 2_000 * PRICES["output"]) / 1e6


def test_unknown_prices_cost_zero():
    with FakeProvider([Reply(content="ok", prompt_tokens=1000, completion_tokens=100)]) as fp:
        nulls = {"input": None, "output": None, "cache_read": None, "cache_write": None}
        model = make_model(fp, prices=nulls, route="openai/unpriced-model")
        completion = model.complete(MESSAGES, TOOLS)
    assert model.prices_known is False
    assert completion.cost_usd == 0.0
    assert completion.usage.input_tokens == 1000


def test_omegaconf_config():
    from omegaconf import OmegaConf

    with FakeProvider([Reply(content="ok")]) as fp:
        cfg = OmegaConf.create(
            {
                "name": "omega",
                "route": "openai/local-model",
                "api_key_env": KEY_ENV,
                "api_base": fp.base_url,
                "context_window": 1000,
                "max_output_tokens": 77,
                "reasoning_effort": None,
                "prices": {"input": 1.0, "output": 2.0, "cache_read": None, "cache_write": None},
                "options": {"temperature": 0.25},
                "timeout_s": 5,
                "retry": {"max_attempts": 2, "base_delay_s": 0.1, "max_delay_s": 1, "budget_s": 10},
            }
        )
        completion = LiteLLMModel(cfg).complete(MESSAGES, [])
    assert completion.message["content"] == "ok"
    body = fp.requests[0].json
    assert body["temperature"] == 0.25 and body["max_tokens"] == 77
    assert "tools" not in body


def test_structured_model_conf_and_per_model_prices():
    """The real ModelConf schema works, and two models on one route keep their own prices (litellm's table is global)."""
    from omegaconf import OmegaConf

    from kbsweep.config.schema import ModelConf

    step = Reply(content="ok", prompt_tokens=1_000_000, completion_tokens=0, cached_tokens=500_000)
    with FakeProvider([step] * 3) as fp:
        models = []
        for name, price in (("cheap", 1.0), ("dear", 3.0)):
            cfg = OmegaConf.structured(
                ModelConf(name=name, route="openai/shared-route", api_key_env=KEY_ENV, api_base=fp.base_url)
            )
            cfg.prices.input, cfg.prices.output, cfg.prices.cache_read = price, price, price / 10
            models.append(LiteLLMModel(cfg))
        cheap, dear = models
        costs = [
            cheap.complete(MESSAGES, []).cost_usd,
            dear.complete(MESSAGES, []).cost_usd,
            cheap.complete(MESSAGES, []).cost_usd,
        ]
    assert costs == pytest.approx([0.5 + 0.05, 1.5 + 0.15, 0.5 + 0.05])
    assert fp.requests[0].json["max_tokens"] == ModelConf.max_output_tokens


@pytest.mark.parametrize(
    "garbled",
    [
        MalformedToolCall(name="write_file", raw_arguments='{"path": "kernel.py", "content": "unterminated'),
        HttpError(
            200, body={"id": "x", "object": "chat.completion", "created": 0, "model": "local-model", "choices": []}
        ),
        HttpError(400, body={"error": {"message": "bad tool schema", "type": "invalid_request_error"}}),
    ],
    ids=["invalid-tool-arguments", "no-choices", "400"],
)
def test_a_garbled_reply_or_a_400_is_the_providers_fault_retried_then_provider_error(garbled):
    sleeps = Sleeps()
    with FakeProvider([garbled, Reply(content="fine")]) as fp:
        assert make_model(fp, sleeps=sleeps).complete(MESSAGES, TOOLS).message["content"] == "fine"
    assert len(fp.requests) == 2 and len(sleeps) == 1
    with FakeProvider([garbled] * 4) as fp:
        with pytest.raises(ProviderFault) as info:
            make_model(fp, sleeps=Sleeps()).complete(MESSAGES, TOOLS)
    assert info.value.outcome is Outcome.PROVIDER_ERROR and "after 4 attempts" in str(info.value)


def test_garbled_replies_are_billed_into_the_answer_or_the_fault():
    """A truncated tool-call reply carries usage the provider charges for: retried then answered, the answer's
    Completion counts it (``failed_usage``, the retry record); never answered, the fault carries every attempt's."""
    truncated = MalformedToolCall(prompt_tokens=1_000, completion_tokens=800)
    per_call = (1_000 * PRICES["input"] + 800 * PRICES["output"]) / 1e6
    with FakeProvider([truncated, Reply(content="fine", prompt_tokens=1_000, completion_tokens=10)]) as fp:
        model = make_model(fp)
        completion = model.complete(MESSAGES, TOOLS)
    assert (completion.usage.input_tokens, completion.usage.output_tokens) == (2_000, 810)
    assert (completion.failed_usage.input_tokens, completion.failed_usage.output_tokens) == (1_000, 800)
    assert completion.cost_usd == pytest.approx(per_call + (1_000 * PRICES["input"] + 10 * PRICES["output"]) / 1e6)
    [retry] = model.last_retries
    assert retry["usage"]["output_tokens"] == 800 and retry["cost_usd"] == pytest.approx(per_call)
    with FakeProvider([truncated] * 4) as fp:
        with pytest.raises(ProviderFault) as info:
            make_model(fp).complete(MESSAGES, TOOLS)
    fault = info.value
    assert (fault.outcome, fault.attempts, fault.status) == (Outcome.PROVIDER_ERROR, 4, None)
    assert (fault.usage.input_tokens, fault.usage.output_tokens) == (4_000, 3_200) and fault.cost_usd == pytest.approx(
        4 * per_call
    )
    assert "not a JSON object" in fault.answer


# ------------------------------------------------------------------------------------------------ retries
@pytest.mark.parametrize("shape", SHAPES)
def test_429_retry_after_is_honored(shape):
    sleeps = Sleeps()
    script = [HttpError(429, retry_after=3), HttpError(429, retry_after="1.5"), Reply(content="finally")]
    with FakeProvider(script) as fp:
        model = make_model(fp, shape, sleeps)
        completion = model.complete(MESSAGES, TOOLS)
    assert completion.message["content"] == "finally"
    assert sleeps == [3.0, 1.5]
    assert len(fp.requests) == 3
    assert [r["delay_source"] for r in model.last_retries] == ["retry-after", "retry-after"]
    assert {r["outcome"] for r in model.last_retries} == {"rate_limited"}


def test_retry_after_http_date():
    sleeps = Sleeps()
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    with FakeProvider([HttpError(429, retry_after=when), Reply(content="ok")]) as fp:
        make_model(fp, sleeps=sleeps).complete(MESSAGES, TOOLS)
    assert len(sleeps) == 1 and 27.0 <= sleeps[0] <= 30.5


def test_retry_after_beyond_budget_gives_up():
    sleeps = Sleeps()
    with FakeProvider([HttpError(429, retry_after=600), Reply(content="never")]) as fp:
        model = make_model(fp, sleeps=sleeps, retry={"budget_s": 60})
        with pytest.raises(ProviderFault) as info:
            model.complete(MESSAGES, TOOLS)
    assert info.value.outcome is Outcome.RATE_LIMITED
    assert "budget" in str(info.value)
    assert sleeps == [] and len(fp.requests) == 1


@pytest.mark.parametrize("shape", SHAPES)
def test_5xx_retried_with_jittered_backoff_then_success(shape):
    sleeps = Sleeps()
    script = [HttpError(500), HttpError(503), HttpError(529 if shape == "anthropic" else 502), Reply(content="up")]
    with FakeProvider(script) as fp:
        completion = make_model(fp, shape, sleeps).complete(MESSAGES, TOOLS)
    assert completion.message["content"] == "up"
    assert len(fp.requests) == 4 and len(sleeps) == 3
    for n, wait in enumerate(sleeps, start=1):  # full jitter: uniform(0, min(max, base * 2**(n-1)))
        assert 0.0 <= wait <= min(8.0, 1.0 * 2 ** (n - 1))


def test_500_forever_is_provider_error_after_max_attempts():
    sleeps = Sleeps()
    with FakeProvider([HttpError(500)] * 10) as fp:
        model = make_model(fp, sleeps=sleeps, retry={"max_attempts": 3})
        with pytest.raises(ProviderFault) as info:
            model.complete(MESSAGES, TOOLS)
    assert info.value.outcome is Outcome.PROVIDER_ERROR
    assert not isinstance(info.value, ContextOverflow)
    assert len(fp.requests) == 3 and len(sleeps) == 2
    assert "3 attempts" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("shape", SHAPES)
def test_slow_answer_times_out_retried_then_provider_error(shape):
    sleeps = Sleeps()
    with FakeProvider([Delay(2.0), Delay(2.0), Reply(content="too late")]) as fp:
        model = make_model(fp, shape, sleeps, timeout_s=0.25, retry={"max_attempts": 2})
        started = time.monotonic()
        with pytest.raises(ProviderFault) as info:
            model.complete(MESSAGES, TOOLS)
        elapsed = time.monotonic() - started
    assert info.value.outcome is Outcome.PROVIDER_ERROR
    assert len(fp.requests) == 2 and len(sleeps) == 1
    assert elapsed < 1.9  # the client gave up at its timeout, not at the server's reply
    assert model.last_retries[0]["error"] == "Timeout"


def test_timeout_then_success():
    sleeps = Sleeps()
    with FakeProvider([Delay(2.0), Reply(content="fast now")]) as fp:
        completion = make_model(fp, sleeps=sleeps, timeout_s=0.25).complete(MESSAGES, TOOLS)
    assert completion.message["content"] == "fast now" and len(sleeps) == 1


@pytest.mark.parametrize("shape", SHAPES)
def test_abrupt_disconnect_is_retried(shape):
    sleeps = Sleeps()
    with FakeProvider([Disconnect(), Reply(content="reconnected")]) as fp:
        completion = make_model(fp, shape, sleeps).complete(MESSAGES, TOOLS)
    assert completion.message["content"] == "reconnected"
    assert len(fp.requests) == 2 and len(sleeps) == 1


def test_abrupt_disconnect_forever_is_provider_error():
    sleeps = Sleeps()
    with FakeProvider([Disconnect()] * 5) as fp:
        model = make_model(fp, sleeps=sleeps, retry={"max_attempts": 2})
        with pytest.raises(ProviderFault) as info:
            model.complete(MESSAGES, TOOLS)
    assert info.value.outcome is Outcome.PROVIDER_ERROR and len(fp.requests) == 2


# ------------------------------------------------------------------------------------------ classification
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "step, outcome",
    [
        (HttpError(401), Outcome.AUTHENTICATION),
        (HttpError(403), Outcome.AUTHENTICATION),
        (HttpError(404), Outcome.MODEL_NOT_FOUND),
        (HttpError(402), Outcome.CREDITS_EXHAUSTED),
        (
            HttpError(
                429,
                body={
                    "error": {
                        "message": "You exceeded your current quota, check your plan and billing details.",
                        "type": "insufficient_quota",
                        "code": "insufficient_quota",
                    }
                },
            ),
            Outcome.CREDITS_EXHAUSTED,
        ),
        (HttpError(429, body="Your credit balance is too low", retry_after=1), Outcome.CREDITS_EXHAUSTED),
    ],
    ids=["401", "403", "404", "402", "429-quota", "429-credit"],
)
def test_non_retryable_errors_are_classified_at_once(shape, step, outcome):
    sleeps = Sleeps()
    with FakeProvider([step, Reply(content="must not be reached")]) as fp:
        with pytest.raises(ProviderFault) as info:
            make_model(fp, shape, sleeps).complete(MESSAGES, TOOLS)
    assert info.value.outcome is outcome
    assert len(fp.requests) == 1 and sleeps == []
    assert "\n" not in str(info.value)


def test_model_not_found_body():
    body = {
        "error": {
            "message": "The model `nope` does not exist",
            "type": "invalid_request_error",
            "code": "model_not_found",
        }
    }
    with FakeProvider([HttpError(404, body=body)]) as fp:
        with pytest.raises(ProviderFault) as info:
            make_model(fp).complete(MESSAGES, TOOLS)
    assert info.value.outcome is Outcome.MODEL_NOT_FOUND and "does not exist" in str(info.value)


@pytest.mark.parametrize("shape", SHAPES)
def test_context_length_error_is_context_overflow(shape):
    sleeps = Sleeps()
    with FakeProvider([ContextLengthError(), Reply(content="unreached")]) as fp:
        with pytest.raises(ContextOverflow) as info:
            make_model(fp, shape, sleeps).complete(MESSAGES, TOOLS)
    assert isinstance(info.value, ProviderFault) and info.value.outcome is Outcome.PROVIDER_ERROR
    assert len(fp.requests) == 1 and sleeps == []


# ------------------------------------------------------------------------------------------------ secrets
@pytest.mark.parametrize("shape", SHAPES)
def test_api_key_reaches_server_but_not_repr(shape):
    with FakeProvider([Reply(content="ok")]) as fp:
        model = make_model(fp, shape)
        model.complete(MESSAGES, TOOLS)
    headers = fp.requests[0].headers
    if shape == "openai":
        assert headers["authorization"] == f"Bearer {SECRET}"
    else:
        assert headers["x-api-key"] == SECRET
    assert SECRET not in repr(model) and SECRET not in str(model)
    assert SECRET not in repr(vars(model))


def test_key_read_at_call_time_and_missing_key(monkeypatch):
    with FakeProvider([Reply(content="one"), Reply(content="two")]) as fp:
        model = make_model(fp)
        monkeypatch.setenv(KEY_ENV, "sk-rotated")
        model.complete(MESSAGES, TOOLS)
        assert fp.requests[0].headers["authorization"] == "Bearer sk-rotated"
        monkeypatch.delenv(KEY_ENV)
        with pytest.raises(ProviderFault) as info:
            model.complete(MESSAGES, TOOLS)
    assert info.value.outcome is Outcome.AUTHENTICATION and KEY_ENV in str(info.value)
    assert len(fp.requests) == 1


# ------------------------------------------------------------------------------------------- fake provider
def _post(url: str, payload: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_fake_provider_callable_script_and_bounds():
    def script(request):
        last = request["messages"][-1]["content"]
        return Reply(content=f"echo: {last}", prompt_tokens=len(last))

    with FakeProvider(script, max_requests=2) as fp:
        url = fp.base_url + "/chat/completions"
        status, body = _post(url, {"model": "m", "messages": [{"role": "user", "content": "hello"}]})
        assert status == 200 and body["choices"][0]["message"]["content"] == "echo: hello"
        assert body["usage"]["prompt_tokens"] == 5
        assert _post(url, {"model": "m", "messages": [{"role": "user", "content": "x"}]})[0] == 200
        status, body = _post(url, {"model": "m", "messages": [{"role": "user", "content": "y"}]})
        assert status == 500 and "max_requests" in body["error"]["message"]
    assert len(fp.requests) == 3

    with FakeProvider([]) as fp:
        status, body = _post(fp.base_url + "/chat/completions", {"model": "m", "messages": []})
    assert status == 500 and "exhausted" in body["error"]["message"]


def test_retry_after_seconds_parsing():
    class Exc(Exception):
        def __init__(self, headers):
            super().__init__("x")
            self.litellm_response_headers = headers

    now = 1_000_000.0
    assert retry_after_seconds(Exc({"retry-after": "7"})) == 7.0
    assert retry_after_seconds(Exc({"Retry-After": "2.5"})) == 2.5
    assert retry_after_seconds(Exc({"retry-after-ms": "250"})) == 0.25
    assert retry_after_seconds(Exc({"retry-after": email.utils.formatdate(now + 12, usegmt=True)}), now=now) == 12.0
    assert retry_after_seconds(Exc({"retry-after": "soon"})) is None
    assert retry_after_seconds(Exc({})) is None


def test_prompt_caching_is_litellms_injection_on_any_route():
    """prompt_caching: true asks litellm (cache_control_injection_points) to mark the system and last messages in
    the route's wire shape; without it the OpenAI-shape request carries no markers (see the request-shape test)."""
    with FakeProvider([Reply(content="ok")]) as fp:
        make_model(fp, "openai", prompt_caching=True).complete(MESSAGES, TOOLS)
    sent = fp.requests[0].json["messages"]
    assert [m.get("cache_control") for m in sent] == [{"type": "ephemeral"}, {"type": "ephemeral"}]
    assert MESSAGES[0] == {"role": "system", "content": "You write GPU kernels."}  # the caller's messages untouched
