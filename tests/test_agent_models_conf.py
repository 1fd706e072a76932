"""conf/model/*.yaml: every file fits the schema; the board's models have litellm routes, context windows and
prices that are either dated and sourced (and match litellm's offline table they cite) or null."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kbsweep.config.schema import ModelConf

pytestmark = pytest.mark.fast

CONF = Path(__file__).resolve().parent.parent / "conf" / "model"
BOARD = [
    "opus-4.8",
    "fable-5",
    "gpt-5.5",
    "gpt-5.5-pro",
    "gemini-3.5-pro",
    "glm-5.2",
    "kimi-k2.7",
    "deepseek-v4",
    "grok-4.5",
    "minimax-m3",
    "qwen-3.8-max",
]
PRICE_KEYS = {
    "input": "input_cost_per_token",
    "output": "output_cost_per_token",
    "cache_read": "cache_read_input_token_cost",
    "cache_write": "cache_creation_input_token_cost",
}


def load(name: str):
    return OmegaConf.merge(OmegaConf.structured(ModelConf), OmegaConf.load(CONF / f"{name}.yaml"))


@lru_cache(maxsize=1)
def offline_table() -> dict:
    """litellm's bundled table as shipped (``litellm.model_cost`` is mutated by price registrations)."""
    import litellm

    return json.loads((Path(litellm.__file__).parent / "model_prices_and_context_window_backup.json").read_text())


def table_entry(prices) -> dict:
    """The entry of litellm's table that ``prices.source`` cites (``key '<name>'``)."""
    return offline_table()[re.search(r"key '([^']+)'", prices.source).group(1)]


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_model_yaml_fits_the_schema(path):
    cfg = OmegaConf.merge(OmegaConf.structured(ModelConf), OmegaConf.load(path))
    assert cfg.name == path.stem and cfg.provider in ("litellm", "scripted", "replay")


@pytest.mark.parametrize("name", BOARD)
def test_board_model(name):
    import litellm

    cfg = load(name)
    assert cfg.provider == "litellm" and cfg.api_key_env and cfg.api_base is None
    assert litellm.get_llm_provider(cfg.route)[1] == cfg.route.split("/")[0]
    prices = cfg.prices
    if prices.input is None:  # unknown: all null, and the file says why
        assert set(OmegaConf.to_container(prices).values()) == {None}
        assert "Prices: null" in (CONF / f"{name}.yaml").read_text()
        return
    assert prices.output is not None and re.fullmatch(r"\d{4}-\d{2}-\d{2}", prices.date) and prices.source
    entry = table_entry(prices)
    for ours, theirs in PRICE_KEYS.items():
        if prices[ours] is None:
            assert theirs not in entry, f"{name}: {ours} is null but litellm lists {entry[theirs]}"
        else:
            assert prices[ours] == pytest.approx(entry[theirs] * 1e6), f"{name}: {ours}"
    assert cfg.context_window == entry["max_input_tokens"]
    assert cfg.max_output_tokens <= entry["max_output_tokens"]


def test_registering_our_prices_keeps_litellms_tiers():
    """gpt-5.5 is dearer above 272k prompt tokens; our registration must not flatten that."""
    import litellm
    from litellm import ModelResponse
    from litellm.types.utils import Usage

    from kbsweep.agent.llm import LiteLLMModel

    def cost(prompt_tokens: int) -> float:
        response = ModelResponse(
            model="gpt-5.5", choices=[{"index": 0, "message": {"role": "assistant", "content": "x"}}]
        )
        response.usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=1000, total_tokens=prompt_tokens + 1000)
        return litellm.completion_cost(completion_response=response, model="openai/gpt-5.5")

    before = cost(400_000)
    LiteLLMModel(OmegaConf.to_container(load("gpt-5.5"))).register_prices()
    assert cost(400_000) == pytest.approx(before) == pytest.approx((400_000 * 10.0 + 1000 * 45.0) / 1e6)
    assert cost(100_000) == pytest.approx((100_000 * 5.0 + 1000 * 30.0) / 1e6)


@pytest.mark.parametrize("name", [n for n in BOARD if n != "gemini-3.5-pro"])  # Gemini's wire format is not faked
def test_board_model_request_reaches_the_provider_and_is_priced(name, monkeypatch):
    """The YAML as shipped (route, reasoning effort, output limit) makes a request litellm sends, priced by our rule."""
    from kbsweep.agent.llm import LiteLLMModel
    from tests.support.fake_provider import FakeProvider, Reply

    cfg = load(name)
    monkeypatch.setenv(cfg.api_key_env, "sk-test-0123456789")
    with FakeProvider([Reply(content="ok", prompt_tokens=1000, completion_tokens=100, cached_tokens=500)]) as fp:
        cfg.api_base = fp.anthropic_base_url if cfg.route.startswith("anthropic/") else fp.base_url
        completion = LiteLLMModel(cfg).complete(
            [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], []
        )
    [request] = fp.requests
    assert request.json["model"] == cfg.route.split("/", 1)[1] and completion.message["content"] == "ok"
    limit = request.json.get("max_tokens") or request.json.get("max_completion_tokens")
    assert limit == cfg.max_output_tokens
    if cfg.route.startswith("anthropic/"):
        assert request.json["output_config"] == {"effort": cfg.reasoning_effort}
    elif cfg.reasoning_effort:
        assert request.json["reasoning_effort"] == cfg.reasoning_effort
    p = cfg.prices
    cache_read = p.input if p.cache_read is None else p.cache_read
    peak = (500 * p.input + 500 * cache_read + 100 * p.output) / 1e6
    discounts = (1.0, 0.5) if "off_peak_pricing" in table_entry(p) else (1.0,)
    assert any(completion.cost_usd == pytest.approx(peak * d) for d in discounts)  # DeepSeek: half price off-peak
