"""Real sweeps (`kbsweep -cd <user conf> model=<yaml> ...`) whose model is litellm talking HTTP to the fake
provider: a multi-turn fix through every recoverable fault, the Anthropic shape, terminal faults as infra outcomes
re-run by the next invocation (one rule whether the solution so far passed or failed), billed garbled replies in the
cell's spend, budgets from the track, replay of a recorded transcript, and secrets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kbsweep import ExitCode
from kbsweep.agent.transcript import read_events
from tests.support.fake_provider import (
    ContextLengthError,
    Delay,
    Disconnect,
    FakeProvider,
    HttpError,
    MalformedToolCall,
    Reply,
)
from tests.support.scripts import call, kernel, multi_turn_fix, write
from tests.support.sweeps import FAST_RETRY, SECRET, cell_runs, model_yaml, results, sweep

PRICES = {"input": 2.0, "output": 10.0, "cache_read": 0.2, "cache_write": None, "date": "2026-12-02", "source": "test"}
USAGE = {"prompt_tokens": 10_000, "cached_tokens": 6_000, "completion_tokens": 500}
PER_CALL_USD = (4_000 * 2.0 + 6_000 * 0.2 + 500 * 10.0) / 1e6  # cached tokens at the cache-read price


def priced(replies):
    for reply in replies:
        for key, value in USAGE.items():
            setattr(reply, key, value)
    return replies


def cell_files(result) -> dict:
    folder = Path(result["folder"])
    names = ("transcript.jsonl", "result.json", "grade.json", "audit.json", "solution.py")
    return {name: (folder / name).read_text() for name in names}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One sweep over the OpenAI shape: the multi-turn fix, with every recoverable fault on the way."""
    tmp = tmp_path_factory.mktemp("recorded")
    wrong, check, fixed, check_again, bench, submit = priced(multi_turn_fix())
    wrong.content = f"Trying a first kernel (my key is {SECRET})."
    wrong.reasoning_content = f"The key {SECRET} must never be written down."
    script = [
        call("list_files"),
        HttpError(429, retry_after=0),
        wrong,
        HttpError(500),
        check,
        Disconnect(),
        MalformedToolCall(),
        ContextLengthError(),
        fixed,
        Delay(4.0),
        check_again,  # past the 2 s timeout: retried
        bench,
        submit,
    ]
    with FakeProvider(script) as fp:
        model_yaml(tmp / "conf", "fake-openai", "openai/fake-openai", fp.base_url, prices=PRICES)
        proc = sweep(tmp / "conf", tmp / "outputs", "model=fake-openai")
    return {"proc": proc, "fp": fp, "outputs": tmp / "outputs", "result": results(tmp / "outputs").get("fake-openai")}


def test_multi_turn_fix_survives_every_recoverable_fault(recorded):
    assert recorded["proc"].returncode == 0, recorded["proc"].stderr
    result = recorded["result"]
    assert result["outcome"] == "pass" and result["score"] > 0 and result["stop_reason"] == "submitted"
    assert result["turns"] == 7 and len(recorded["fp"].requests) == 13
    prompt = recorded["fp"].requests[0].json["messages"][1]["content"]
    assert "a CPU (no GPU)" in prompt  # the problem's prompt with the GPU's description
    events = read_events(Path(result["folder"]) / "transcript.jsonl")
    retries = [e for e in events if e["type"] == "retry"]
    assert len(retries) == 5 and {e["status"] for e in retries} >= {429, 500}
    assert any("not a JSON object" in e["message"] for e in retries)  # the garbled tool call: the provider's, retried
    [compaction] = [e for e in events if e["type"] == "compaction"]
    assert compaction["keep"] == 2
    tools = [e["content"] for e in events if e["type"] == "tool"]
    assert tools[0] == "prompt.md\nreference.py"  # a fresh workspace: the problem's public files only
    assert tools[2].startswith("outcome: incorrect") and tools[4].startswith("outcome: pass")
    assert "roofline=" in tools[5]  # run_benchmark reports the roofline fraction per shape
    assert (Path(result["folder"]) / "solution.py").read_text() == kernel("triton")


def test_cost_and_tokens_per_run(recorded):
    result = recorded["result"]
    usage = result["usage"]
    assert usage["cached_tokens"] == 6 * 6_000 and usage["input_tokens"] == 6 * 10_000 + 2 * 10
    assert usage["output_tokens"] == 6 * 500 + 2 * 5 and "reasoning_tokens" in usage
    small_usd = (
        10 * 2.0 + 5 * 10.0
    ) / 1e6  # list_files and the garbled reply (billed, then retried): 10 + 5 tokens each, nothing cached
    assert result["cost_usd"] == pytest.approx(6 * PER_CALL_USD + 2 * small_usd)
    [run] = cell_runs(recorded["outputs"])
    assert run.info.status == "FINISHED" and run.data.tags["outcome"] == "pass"
    assert run.data.metrics["cost_usd"] == pytest.approx(result["cost_usd"])
    assert run.data.metrics["tokens_cached"] == 36_000


def test_the_key_is_sent_but_never_written(recorded):
    assert recorded["fp"].requests[0].headers["authorization"] == f"Bearer {SECRET}"
    files = cell_files(recorded["result"])
    for name, text in files.items():
        assert SECRET not in text, name
    assert "my key is [REDACTED]" in files["transcript.jsonl"]


def test_replay_reproduces_the_solution_and_outcome(recorded, tmp_path):
    original = recorded["result"]
    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    transcript = Path(original["folder"]) / "transcript.jsonl"
    (conf / "model" / "replay.yaml").write_text(f"name: replay\nprovider: replay\ntranscript: {transcript}\n")
    proc = sweep(conf, tmp_path / "outputs", "model=replay")
    assert proc.returncode == 0, proc.stderr
    replayed = results(tmp_path / "outputs")["replay"]
    assert (replayed["outcome"], replayed["stop_reason"], replayed["turns"]) == ("pass", "submitted", original["turns"])
    assert (Path(replayed["folder"]) / "solution.py").read_text() == (
        Path(original["folder"]) / "solution.py"
    ).read_text()
    assert replayed["usage"] == original["usage"] and replayed["cost_usd"] == pytest.approx(original["cost_usd"])


LEAKY = kernel("wrong").replace("        x = x.contiguous()", f'        raise RuntimeError("the key is {SECRET}")')


def test_anthropic_shape_sweep_prices_cache_and_redacts_grades(tmp_path):
    prices = {
        "input": 3.0,
        "output": 15.0,
        "cache_read": 0.3,
        "cache_write": 3.75,
        "date": "2026-12-02",
        "source": "test",
    }
    usage = dict(prompt_tokens=20_000, cached_tokens=12_000, cache_write_tokens=4_000, completion_tokens=1_000)
    script = [
        Reply(tool_calls=[("write_file", {"path": "solution.py", "content": LEAKY})], **usage),
        Reply(tool_calls=[("run_check", {})], **usage),
        Reply(tool_calls=[("submit", {})], **usage),
    ]
    with FakeProvider(script) as fp:
        model_yaml(
            tmp_path / "conf",
            "fake-claude",
            "anthropic/claude-fake-4-8",
            fp.anthropic_base_url,
            prices=prices,
            prompt_caching=True,
        )
        proc = sweep(tmp_path / "conf", tmp_path / "outputs", "model=fake-claude")
    assert proc.returncode == 0, proc.stderr
    result = results(tmp_path / "outputs")["fake-claude"]
    assert result["outcome"] == "runtime_error" and result["score"] is None  # graded: the model's own doing
    assert "[REDACTED]" in result["message"]
    assert all(r.path == "/v1/messages" and r.headers["x-api-key"] == SECRET for r in fp.requests)
    assert fp.requests[-1].json["system"][-1]["cache_control"] == {"type": "ephemeral"}
    per_call = (4_000 * 3.0 + 12_000 * 0.3 + 4_000 * 3.75 + 1_000 * 15.0) / 1e6
    assert result["cost_usd"] == pytest.approx(3 * per_call)
    assert result["usage"]["cache_write_tokens"] == 12_000
    for name, text in cell_files(result).items():
        assert SECRET not in text, name
    [run] = cell_runs(tmp_path / "outputs")
    assert run.info.status == "FINISHED" and run.data.tags["outcome"] == "runtime_error"


TERMINAL = {
    "fake-429": ([HttpError(429, retry_after=0)] * 3, "rate_limited"),
    "fake-401": ([HttpError(401)], "authentication"),
    "fake-404": ([HttpError(404)], "model_not_found"),
    "fake-402": ([HttpError(402)], "credits_exhausted"),
}


def test_terminal_faults_are_infra_not_scored_and_rerun(tmp_path):
    conf, outputs = tmp_path / "conf", tmp_path / "outputs"
    models = ",".join(TERMINAL)
    with FakeProvider(
        {name: steps for name, (steps, _) in TERMINAL.items()} | {"fake-done": ["I cannot do this."]}
    ) as fp:
        for name in [*TERMINAL, "fake-done"]:
            model_yaml(conf, name, f"openai/{name}", fp.base_url)
        assert (
            sweep(conf, outputs, "model=fake-done", "sweep.name=earlier").returncode == 0
        )  # another sweep's board in the store
        proc = sweep(conf, outputs, "-m", f"model={models}")
        assert "fake-done" not in proc.stdout  # a sweep prints its own boards only
        assert proc.returncode == ExitCode.INFRA, proc.stderr  # no cell finished: the sweep is to be run again
        first = results(outputs)
        assert {name: r["outcome"] for name, r in first.items()} == {n: o for n, (_, o) in TERMINAL.items()}
        assert all(r["score"] is None and r["stop_reason"] == "provider_fault" for r in first.values())
        assert all(not (Path(r["folder"]) / "grade.json").exists() for r in first.values())
        runs = cell_runs(outputs)
        assert {r.data.tags["model"]: r.data.tags["outcome"] for r in runs} == {n: o for n, (_, o) in TERMINAL.items()}
        assert {r.info.status for r in runs} == {"FAILED"}
        assert "nothing scored" in proc.stdout and all(
            name in proc.stdout for name in TERMINAL
        )  # listed with their infra count, never ranked

        for name in TERMINAL:  # the provider recovers (the models give up at once: no grading); the same sweep again
            fp.add("I cannot do this.", model=name)
        proc = sweep(conf, outputs, "-m", f"model={models}")
    assert proc.returncode == 0, proc.stderr
    assert "4 to run" in proc.stderr
    assert {name: r["outcome"] for name, r in results(outputs).items()} == dict.fromkeys(TERMINAL, "no_solution")
    runs = cell_runs(outputs)
    assert [r.info.status for r in runs] == ["FAILED"] * 4 + ["FINISHED"] * 4
    assert all(name in proc.stdout for name in TERMINAL)  # now on the leaderboard (scored 0)


DEAD = [HttpError(503)] * FAST_RETRY["max_attempts"]  # the provider fails for good
AFTER = {
    "fake-after-pass": [write("triton"), call("run_check"), *DEAD],
    "fake-after-fail": [write("wrong"), call("run_check"), *DEAD],
}


def test_a_fault_for_good_is_infra_whether_the_solution_so_far_passed_or_failed(tmp_path):
    """The same fault after a passing check and after a failing one: one outcome class (infra), the partial work
    recorded but not scored, and both cells redone by the next run of the sweep."""
    conf, outputs = tmp_path / "conf", tmp_path / "outputs"
    with FakeProvider(AFTER) as fp:
        for name in AFTER:
            model_yaml(conf, name, f"openai/{name}", fp.base_url)
        proc = sweep(conf, outputs, "-m", f"model={','.join(AFTER)}")
        assert proc.returncode == ExitCode.INFRA, proc.stderr
        first = results(outputs)
        assert {name: (r["outcome"], r["score"]) for name, r in first.items()} == dict.fromkeys(
            AFTER, ("provider_error", None)
        )
        assert re.search(
            r"; its solution so far graded pass \(score [0-9.]+\), not scored$", first["fake-after-pass"]["message"]
        )
        assert first["fake-after-fail"]["message"].endswith("; its solution so far graded incorrect, not scored")
        for result in first.values():  # the partial work: solution and grade kept
            assert {"solution.py", "grade.json"} <= {p.name for p in Path(result["folder"]).iterdir()}
        assert {
            r.data.tags["model"]: (r.info.status, r.data.tags["outcome_class"]) for r in cell_runs(outputs)
        } == dict.fromkeys(AFTER, ("FAILED", "infra"))
        for name in AFTER:
            fp.add("I cannot do this.", model=name)
        proc = sweep(conf, outputs, "-m", f"model={','.join(AFTER)}")
    assert proc.returncode == 0 and "2 to run" in proc.stderr, proc.stderr
    assert {name: r["outcome"] for name, r in results(outputs).items()} == dict.fromkeys(AFTER, "no_solution")


def test_truncated_tool_call_json_to_the_end_is_provider_error_with_its_tokens_and_dollars(tmp_path):
    """Six replies whose tool-call JSON is cut short: a provider_error after 6 attempts, every reply's tokens and
    dollars in the cell's totals (the provider bills them)."""
    truncated = MalformedToolCall(prompt_tokens=10_000, completion_tokens=500)
    with FakeProvider([truncated] * 6) as fp:
        model_yaml(
            tmp_path / "conf",
            "fake-cut",
            "openai/fake-cut",
            fp.base_url,
            prices=PRICES,
            retry={**FAST_RETRY, "max_attempts": 6},
        )
        proc = sweep(tmp_path / "conf", tmp_path / "outputs", "model=fake-cut")
    assert proc.returncode == ExitCode.INFRA, proc.stderr
    result = results(tmp_path / "outputs")["fake-cut"]
    per_call = (10_000 * 2.0 + 500 * 10.0) / 1e6
    assert result["outcome"] == "provider_error" and "after 6 attempts" in result["message"] and result["turns"] == 0
    assert (result["usage"]["input_tokens"], result["usage"]["output_tokens"]) == (60_000, 3_000)
    assert result["cost_usd"] == pytest.approx(6 * per_call) and result["agent_cost_usd"] == pytest.approx(6 * per_call)
    events = read_events(Path(result["folder"]) / "transcript.jsonl")
    assert [e["cost_usd"] for e in events if e["type"] == "retry"] == pytest.approx([per_call] * 5)
    [error] = [e for e in events if e["type"] == "error"]
    assert error["usage"]["output_tokens"] == 3_000 and error["cost_usd"] == pytest.approx(6 * per_call)
    [run] = cell_runs(tmp_path / "outputs")
    assert run.data.metrics["cost_usd"] == pytest.approx(6 * per_call) and run.data.metrics["tokens_output"] == 3_000


def test_budgets_come_from_the_track(tmp_path):
    with FakeProvider(priced([call("list_files") for _ in range(5)])) as fp:
        model_yaml(tmp_path / "conf", "fake-budget", "openai/fake-budget", fp.base_url, prices=PRICES)
        proc = sweep(
            tmp_path / "conf", tmp_path / "outputs", "model=fake-budget", "track.max_turns=4", "+track.max_usd=0.025"
        )  # demo.yaml lists no max_usd
    assert proc.returncode == 0, proc.stderr
    result = results(tmp_path / "outputs")["fake-budget"]
    assert (result["stop_reason"], result["turns"]) == ("dollar_budget", 2)  # 2 × 0.0142 ≥ 0.025 before turn 4
    assert result["outcome"] == "budget_exhausted" and len(fp.requests) == 2


def test_dollar_budget_with_null_prices_refuses_to_start(tmp_path):
    with FakeProvider([]) as fp:
        model_yaml(tmp_path / "conf", "unpriced", "openai/unpriced", fp.base_url)
        proc = sweep(tmp_path / "conf", tmp_path / "outputs", "model=unpriced", "+track.max_usd=5")
    assert not fp.requests
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("kbsweep: error: model 'unpriced' has no prices") and "max_usd=5" in line
    assert not (tmp_path / "outputs" / "sweeps").exists()
