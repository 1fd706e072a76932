"""The agent loop with LiteLLMModel over real HTTP (the fake provider in this process) and a stub grader:
budgets, the context rule, malformed arguments, retries in the transcript, tool errors."""

from __future__ import annotations

import json
import time

import pytest

from kbsweep import KbsweepError
from kbsweep.agent.llm import LiteLLMModel
from kbsweep.agent.loop import Budgets, run_agent, shorten_context, stub_arguments
from kbsweep.agent.tools import MAX_TOOL_OUTPUT, Toolbox
from kbsweep.agent.transcript import Redactor, Transcript, read_events
from kbsweep.outcomes import Outcome, StopReason
from tests.support.fake_provider import ContextLengthError, Delay, FakeProvider, HttpError, MalformedToolCall, Reply
from tests.support.scripts import call, multi_turn_fix

PRICES = {"input": 2.0, "output": 10.0, "cache_read": 0.2, "cache_write": None}


class Run:
    """One loop run: workspace, toolbox with a stub grader, transcript."""

    def __init__(self, tmp_path, fp: FakeProvider, **model):
        self.workspace = tmp_path / "workspace"
        self.workspace.mkdir()
        self.grades = []
        self.toolbox = Toolbox(workspace=self.workspace, grade=self.grade)
        self.transcript = Transcript(tmp_path / "transcript.jsonl", Redactor())
        config = {
            "name": "loop",
            "route": "openai/loop-model",
            "api_base": fp.base_url,
            "prices": PRICES,
            "timeout_s": 10,
        }
        self.model = LiteLLMModel({**config, **model}, sleep=lambda s: None)
        self.fp = fp

    def grade(self, mode: str):
        self.grades.append(mode)
        return {"outcome": "pass", "score": 0.25, "shapes": []}

    def __call__(self, budgets: Budgets | None = None, window: int = 100_000):
        budgets = Budgets() if budgets is None else budgets
        return run_agent(self.model, "Make scale_shift fast.", self.toolbox, budgets, self.transcript, window)

    def events(self, kind: str):
        return [e for e in read_events(self.transcript.path) if e["type"] == kind]


def listing(n: int, **usage) -> list:
    return [Reply(tool_calls=[("list_files", {})], **usage) for _ in range(n)]


def test_multi_turn_fix_records_every_event(tmp_path):
    with FakeProvider(multi_turn_fix()) as fp:
        run = Run(tmp_path, fp)
        result = run()
    assert result.stop_reason is StopReason.SUBMITTED and result.turns == 6
    assert run.grades == ["check", "check", "bench"]
    assert "tl.store(y_ptr + offsets, x * w + b" in (run.workspace / "solution.py").read_text()
    assert [e["name"] for e in run.events("tool")] == [
        "write_file",
        "run_check",
        "write_file",
        "run_check",
        "run_benchmark",
        "submit",
    ]
    [stop] = run.events("stop")
    assert stop["reason"] == "submitted" and stop["turns"] == 6
    # the second request carries the tool result of the first call
    sent = fp.requests[1].json["messages"]
    assert sent[-1]["role"] == "tool" and sent[-1]["content"].startswith("wrote")


@pytest.mark.fast
def test_turn_budget(tmp_path):
    with FakeProvider(listing(10)) as fp:
        result = Run(tmp_path, fp)(Budgets(max_turns=3))
    assert result.stop_reason is StopReason.MAX_TURNS and result.turns == 3 and len(fp.requests) == 3


@pytest.mark.fast
def test_token_budget(tmp_path):
    with FakeProvider(listing(10, prompt_tokens=1000, completion_tokens=100)) as fp:
        result = Run(tmp_path, fp)(Budgets(max_tokens=2500))
    assert result.stop_reason is StopReason.TOKEN_BUDGET
    assert result.turns == 3 and result.usage.total == 3300


@pytest.mark.fast
def test_dollar_budget_counts_cached_tokens_at_the_cache_read_price(tmp_path):
    usage = dict(prompt_tokens=100_000, completion_tokens=1_000, cached_tokens=80_000)
    per_call = (20_000 * 2.0 + 80_000 * 0.2 + 1_000 * 10.0) / 1e6  # 0.066
    with FakeProvider(listing(10, **usage)) as fp:
        result = Run(tmp_path, fp)(Budgets(max_usd=0.15))
    assert result.stop_reason is StopReason.DOLLAR_BUDGET and result.turns == 3
    assert result.cost_usd == pytest.approx(3 * per_call)
    assert result.usage.cached_tokens == 240_000


@pytest.mark.fast
def test_wall_clock_cuts_a_slow_call(tmp_path):
    with FakeProvider(
        [Reply(content="warm")]
    ) as fp:  # litellm's first call in a process loads for seconds, not what is timed
        (tmp_path / "warm").mkdir()
        Run(tmp_path / "warm", fp)()
    with FakeProvider([Reply(tool_calls=[("list_files", {})]), Delay(5.0, Reply(content="too late"))]) as fp:
        run = Run(tmp_path, fp, timeout_s=60)
        started = time.monotonic()
        result = run(Budgets(wall_s=1.5))
        elapsed = time.monotonic() - started  # before the fake provider's shutdown, which may wait out its delay
    assert elapsed < 4.0  # the call was cut at the deadline, not at timeout_s or the reply
    assert result.stop_reason is StopReason.WALL_CLOCK and result.fault is None
    assert run.events("error")  # what happened is still in the transcript


@pytest.mark.fast
def test_dollar_budget_with_null_prices_refuses_with_one_line():
    model = {"name": "gemini-3.5-pro", "provider": "litellm", "prices": {"input": None, "output": None}}
    track = {"time_cap_s": 60, "max_turns": 5, "max_usd": 20.0}
    with pytest.raises(KbsweepError) as info:
        Budgets.of_cell(model, track)
    assert "gemini-3.5-pro" in str(info.value) and "max_usd=20" in str(info.value) and "\n" not in str(info.value)
    assert Budgets.of_cell(model, {**track, "max_usd": None}).max_usd is None
    assert Budgets.of_cell({**model, "prices": {"input": 1.0, "output": 2.0}}, track).max_usd == 20.0


@pytest.mark.fast
def test_context_rule_near_the_window(tmp_path):
    big = "x" * 3000
    script = (
        [call("write_file", path="big.txt", content=big)]
        + [call("read_file", path="big.txt") for _ in range(6)]
        + ["done"]
    )
    with FakeProvider(script) as fp:
        run = Run(tmp_path, fp)
        result = run(window=4000)  # 75%: 3000 tokens ≈ 12,000 characters
    assert result.stop_reason is StopReason.MODEL_STOPPED
    assert run.events("compaction")
    last = fp.requests[-1].json["messages"]
    results = [m["content"] for m in last if m["role"] == "tool"]
    assert results[0] == "wrote 3000 characters to big.txt"  # short: left whole
    assert results[1:-4] and all(r == "[shortened: 3000 characters] " + "x" * 200 for r in results[1:-4])
    assert results[-4:] == [big] * 4
    written = json.loads(next(m for m in last if m.get("tool_calls"))["tool_calls"][0]["function"]["arguments"])
    assert written == {"path": "big.txt", "content": "[shortened: 3000 characters] " + "x" * 200}


@pytest.mark.fast
def test_context_overflow_shortens_and_continues(tmp_path):
    script = listing(5) + [ContextLengthError(), Reply(tool_calls=[("submit", {})])]
    with FakeProvider(script) as fp:
        run = Run(tmp_path, fp)
        result = run()
    assert result.stop_reason is StopReason.SUBMITTED and result.fault is None
    [compaction] = run.events("compaction")
    assert compaction["keep"] == 2 and compaction["shortened"] == 0  # the listings are short: nothing to cut
    assert len(fp.requests) == 7


@pytest.mark.fast
def test_context_overflow_that_persists_is_a_provider_fault(tmp_path):
    with FakeProvider([ContextLengthError()] * 3) as fp:
        run = Run(tmp_path, fp)
        result = run()
    assert result.stop_reason is StopReason.PROVIDER_FAULT and result.fault["outcome"] == Outcome.PROVIDER_ERROR.value
    assert [e["keep"] for e in run.events("compaction")] == [2, 0] and len(fp.requests) == 3


@pytest.mark.fast
def test_garbled_tool_arguments_are_the_providers_retried_and_the_loop_continues(tmp_path):
    with FakeProvider([MalformedToolCall(), Reply(tool_calls=[("submit", {})])]) as fp:
        run = Run(tmp_path, fp)
        result = run()
    assert result.stop_reason is StopReason.SUBMITTED and result.turns == 1
    [retry] = run.events("retry")
    assert retry["outcome"] == "provider_error" and "not a JSON object" in retry["message"]
    assert fp.requests[1].json["messages"] == fp.requests[0].json["messages"]  # the same request again


@pytest.mark.fast
def test_retries_and_faults_are_in_the_transcript(tmp_path):
    with FakeProvider([HttpError(429, retry_after=0), HttpError(401)]) as fp:
        run = Run(tmp_path, fp)
        result = run()
    assert result.stop_reason is StopReason.PROVIDER_FAULT and result.fault["outcome"] == "authentication"
    [retry] = run.events("retry")
    assert retry["status"] == 429 and retry["delay_source"] == "retry-after"
    assert run.events("error")[0]["outcome"] == "authentication"


@pytest.mark.fast
def test_tool_errors_come_back_as_results(tmp_path, monkeypatch):
    monkeypatch.setenv("KBSWEEP_TEST_HIDDEN", "hidden-value-123")
    box = Toolbox(workspace=tmp_path, grade=lambda mode: {}, secret_env=["KBSWEEP_TEST_HIDDEN"])
    assert box.call("read_file", '{"path": "../etc/passwd"}').startswith("error: ../etc/passwd: outside the workspace")
    assert box.call("read_file", '{"path": "nope.py"}') == "error: nope.py: no such file"
    assert box.call("write_file", '{"path": ".", "content": "x"}').startswith("error:")  # a directory
    assert box.call("write_file", '{"path": "a.py"}').startswith("error: bad arguments for write_file")
    assert box.call("run_check", "{}") == "error: write solution.py first"
    assert box.call("frobnicate", "{}") == "error: unknown tool 'frobnicate'"
    assert box.call("write_file", "[1, 2]").startswith("error: malformed arguments")
    (tmp_path / "huge.txt").write_text("y" * (3 * MAX_TOOL_OUTPUT))
    out = box.call("read_file", '{"path": "huge.txt"}')
    assert len(out) < MAX_TOOL_OUTPUT + 100 and f"[... {2 * MAX_TOOL_OUTPUT} characters truncated ...]" in out
    assert box.call("run_shell", '{"command": "echo [$KBSWEEP_TEST_HIDDEN]"}') == "exit code 0\n[]\n"
    no_shell = Toolbox(workspace=tmp_path, grade=lambda mode: {}, allow_shell=False)
    assert "run_shell" not in [s["function"]["name"] for s in no_shell.schemas()]
    assert no_shell.call("run_shell", '{"command": "true"}') == "error: unknown tool 'run_shell'"


@pytest.mark.fast
def test_shortening_keeps_arguments_json_and_is_idempotent():
    assert stub_arguments('{"path": "a.py"}') == '{"path": "a.py"}'
    assert json.loads(stub_arguments('{"content": "' + "z" * 500 + '"}'))["content"].startswith(
        "[shortened: 500 characters] zz"
    )
    malformed = '{"content": "' + "z" * 500
    assert json.loads(stub_arguments(malformed)) == {
        "shortened": f"[shortened: {len(malformed)} characters] {malformed[:200]}"
    }
    messages = [{"role": "tool", "content": "r" * 300} for _ in range(3)]
    assert shorten_context(messages, keep=1) == 2 and shorten_context(messages, keep=1) == 0
    assert messages[-1]["content"] == "r" * 300
