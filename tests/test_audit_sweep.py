"""The LLM judge inside a sweep: with ``audit.judge`` set, every cell runs it as the third layer of its own audit.
Real `kbsweep` sweeps of demo/scale_shift on the CPU with the built-in scripted agent; the judge is a model YAML
(litellm) pointed at the local fake provider. Its verdict, answer, tokens and dollars land in audit.json and
result.json; a malformed answer ends in needs_human with the grade and score kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kbsweep.agent.models import ScriptedModel
from kbsweep.audit import audit
from kbsweep.audit.judge import LazyModel
from tests.support.fake_provider import FakeProvider, Reply
from tests.support.sweeps import SECRET, cell_runs, model_yaml, results, sweep

PRICES = {"input": 2.0, "output": 10.0, "cache_read": None, "cache_write": None, "date": "2026-12-02", "source": "test"}
TOKENS = dict(prompt_tokens=1_200, completion_tokens=80)
PER_CALL_USD = (1_200 * 2.0 + 80 * 10.0) / 1e6
QUOTE = "tl.store(y_ptr + offsets, x * w + b, mask=mask)"  # a line of the bundled Triton kernel the agent hands in


def judged_sweep(tmp: Path, *replies: Reply):
    """A sweep of the scripted agent with ``audit.judge=fake-judge``; returns (process, requests, result, audit.json)."""
    with FakeProvider(list(replies)) as fp:
        model_yaml(tmp / "conf", "fake-judge", "openai/fake-judge", fp.base_url, prices=PRICES)
        proc = sweep(tmp / "conf", tmp / "outputs", "model=scripted", "audit.judge=fake-judge")
    assert proc.returncode == 0, proc.stderr
    result = results(tmp / "outputs")["scripted"]
    return proc, fp.requests, result, json.loads((Path(result["folder"]) / "audit.json").read_text())


def test_a_sweep_runs_the_judge_in_every_cell(tmp_path):
    answer = {
        "verdict": "rubric_leak",
        "summary": "stores in fp32",
        "quotes": [{"source": "solution", "text": QUOTE, "why": "test"}],
    }
    _, requests, result, audited = judged_sweep(tmp_path, Reply(content=json.dumps(answer), **TOKENS))

    [request] = requests  # one judge call for the one cell
    assert request.headers["authorization"] == f"Bearer {SECRET}"  # the judge's own key, from its model YAML
    user = request.json["messages"][1]["content"]
    assert "scale_shift_kernel[(triton.cdiv(n, block),)]" in user and "## Transcript excerpts" in user

    judge = audited["layers"]["judge"]
    assert judge["model"] == "fake-judge" and judge["verdict"] == "rubric_leak" and judge["attempts"] == 1
    assert json.loads(judge["answer"]) == answer
    assert set(audited["layers"]) == {"static", "dynamic", "contamination", "judge"}
    [found] = [f for f in audited["findings"] if f["layer"] == "judge"]
    assert found["kind"] == "judge" and found["verdict"] == "rubric_leak" and found["quotes"][0]["text"] == QUOTE
    assert audited["verdict"] == result["verdict"] == "rubric_leak"  # the judge's verdict is the cell's

    assert result["outcome"] == "pass" and result["score"] > 0
    assert judge["usage"]["input_tokens"] == 1_200 and judge["usage"]["output_tokens"] == 80
    assert result["judge_usage"] == judge["usage"]
    assert result["judge_cost_usd"] == pytest.approx(PER_CALL_USD) == judge["cost_usd"]
    assert result["agent_cost_usd"] == 0.0  # the scripted agent is free
    assert result["cost_usd"] == pytest.approx(result["agent_cost_usd"] + result["judge_cost_usd"])
    assert result["usage"]["input_tokens"] > 0 and result["usage"] != result["judge_usage"]  # the agent's tokens apart

    [run] = cell_runs(tmp_path / "outputs")
    assert run.data.tags["verdict"] == "rubric_leak"
    assert run.data.metrics["cost_usd"] == pytest.approx(PER_CALL_USD)  # the cell's total includes the judge
    assert (
        run.data.metrics["judge_cost_usd"] == pytest.approx(PER_CALL_USD) and run.data.metrics["agent_cost_usd"] == 0.0
    )
    assert (
        run.data.metrics["judge_tokens_input"] == 1_200
        and run.data.metrics["tokens_input"] == result["usage"]["input_tokens"]
    )
    for path in (tmp_path / "outputs").rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".py", ".log"):
            assert SECRET not in path.read_text(errors="replace"), path


def test_a_malformed_judge_answer_ends_in_needs_human_with_the_grade_kept(tmp_path):
    _, requests, result, audited = judged_sweep(
        tmp_path,
        Reply(content="The kernel looks fine to me.", **TOKENS),
        Reply(content='{"verdict": "fine"}', **TOKENS),
    )
    assert len(requests) == 2  # asked again once
    judge = audited["layers"]["judge"]
    assert judge["verdict"] == "needs_human" and judge["attempts"] == 2 and "verdict must be one of" in judge["error"]
    [found] = [f for f in audited["findings"] if f["layer"] == "judge"]
    assert found["kind"] == "judge_error" and found["verdict"] == "needs_human"
    assert audited["verdict"] == result["verdict"] == "needs_human"

    assert result["outcome"] == "pass" and result["score"] > 0 and result["shapes"]  # the grade is not lost
    assert (Path(result["folder"]) / "grade.json").exists() and (Path(result["folder"]) / "solution.py").exists()
    assert (
        result["judge_cost_usd"] == pytest.approx(2 * PER_CALL_USD) and result["judge_usage"]["input_tokens"] == 2_400
    )
    [run] = cell_runs(tmp_path / "outputs")
    assert run.info.status == "FINISHED" and run.data.tags["verdict"] == "needs_human" and run.data.metrics["score"] > 0


@pytest.mark.fast
def test_a_judge_that_cannot_run_is_a_judge_error_not_an_exception():
    source = "import torch\n"
    broken = LazyModel({"name": "broken", "provider": "litellm", "route": None})  # fails when it is built
    result = audit(source, [], None, judge=broken)
    assert result["verdict"] == "needs_human" and result["layers"]["judge"]["error"].startswith("ValueError")

    class Crashing(ScriptedModel):
        def complete(self, *args, **kwargs):
            raise RuntimeError("socket went away")

    result = audit(source, [], None, judge=Crashing({"name": "crash", "script": []}, {}))
    [found] = [f for f in result["findings"] if f["layer"] == "judge"]
    assert found["kind"] == "judge_error" and "socket went away" in found["detail"]


def test_a_bad_judge_is_refused_before_any_cell_runs(tmp_path, cli, outputs):
    proc = cli("plan", "track=demo", "gpu=cpu", "audit.judge=no-such-model")
    assert proc.returncode == 2 and "audit.judge: no model 'no-such-model'" in proc.stderr
    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    (conf / "model" / "bad-judge.yaml").write_text("name: bad-judge\ncontext_window: lots\n")
    proc = cli("plan", "-cd", str(conf), "track=demo", "gpu=cpu", "audit.judge=bad-judge")
    assert proc.returncode == 2 and "bad-judge.yaml: key 'context_window'" in proc.stderr
    assert not (outputs / "sweeps").exists()


@pytest.mark.fast
def test_judge_metrics_are_logged_only_where_a_judge_was_asked():
    from types import SimpleNamespace

    from kbsweep.agent.models import Usage
    from kbsweep.cell import spend
    from kbsweep.tracking.tracker import cell_metrics

    agent = SimpleNamespace(usage=Usage(input_tokens=700, output_tokens=30), cost_usd=0.01)
    unjudged = spend(agent, {"layers": {"static": {}, "dynamic": {}}})
    assert unjudged["judge_usage"] is None and unjudged["judge_cost_usd"] is None and unjudged["cost_usd"] == 0.01
    metrics = cell_metrics(unjudged)
    assert (
        not [k for k in metrics if k.startswith("judge")]
        and metrics["tokens_input"] == 700
        and metrics["cost_usd"] == 0.01
    )

    asked = {"usage": {"input_tokens": 1_200, "output_tokens": 80}, "cost_usd": PER_CALL_USD}
    judged = cell_metrics(spend(agent, {"layers": {"judge": asked}}))
    assert judged["judge_tokens_input"] == 1_200 and judged["judge_cost_usd"] == pytest.approx(PER_CALL_USD)
    assert judged["cost_usd"] == pytest.approx(0.01 + PER_CALL_USD)


CHEAP = {**PRICES, "input": 0.5, "output": 1.0}


def plan_json(cli, conf: Path, *overrides: str):
    proc = cli("plan", "--json", "-cd", str(conf), *overrides, "track=demo", "problem=scale_shift", "gpu=cpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_the_judge_is_on_by_default_where_a_sweep_has_a_keyed_model_and_plan_counts_it(tmp_path, cli):
    """Left null, audit.judge is the cheapest keyed model the sweep configures, on every cell of a scored track
    (the keyless scripted model's too); plan counts its calls in the model spend and shows them. No keyed model
    (the embedded default), audit.judge=off or an unscored track: no judge."""
    from kbsweep.planner.judging import JUDGE_TOKENS

    conf = tmp_path / "conf"
    model_yaml(conf, "fake-dear", "openai/fake-dear", "http://127.0.0.1:9/v1", prices=PRICES)
    model_yaml(conf, "fake-cheap", "openai/fake-cheap", "http://127.0.0.1:9/v1", prices=CHEAP)
    plan = plan_json(cli, conf, "-m", "model=fake-dear,fake-cheap,scripted")
    call = (JUDGE_TOKENS["input"] * CHEAP["input"] + JUDGE_TOKENS["output"] * CHEAP["output"]) / 1e6
    assert plan["judge"] == {
        "models": {"fake-cheap": 3},
        "cells": 3,
        "usd": pytest.approx(3 * call),
        "expected_tokens": JUDGE_TOKENS,
        "unpriced": [],
    }
    agents = sum((2_000_000 * p["input"] + 150_000 * p["output"]) / 1e6 for p in (PRICES, CHEAP))
    assert plan["model_usd"] == pytest.approx(agents + 3 * call)
    text = cli(
        "plan",
        "-cd",
        str(conf),
        "-m",
        "model=fake-dear,fake-cheap,scripted",
        "track=demo",
        "problem=scale_shift",
        "gpu=cpu",
    )
    assert text.returncode == 0 and f"judge: fake-cheap (3 cells); ≈ ${3 * call:.2f}" in text.stdout, text.stdout
    named = plan_json(cli, conf, "-m", "model=fake-cheap,scripted", "audit.judge=fake-dear")["judge"]
    assert named["models"] == {"fake-dear": 2}
    assert plan_json(cli, conf, "model=scripted")["judge"] is None  # no key: the embedded default has no judge
    assert plan_json(cli, conf, "model=fake-cheap", "audit.judge=off")["judge"] is None
    proof = cli("plan", "--json", "-cd", str(conf), "model=fake-cheap", "track=proof", "gpu=cpu")
    assert proof.returncode == 0 and json.loads(proof.stdout)["judge"] is None  # timer validation ranks no model


def test_a_sweep_of_a_keyed_model_is_judged_by_default(tmp_path):
    """The agent's own model is the sweep's only keyed one: after its final grade, each cell asks it as the judge
    (the rubric, the files fenced) and records its answer and cost."""
    from kbsweep.audit.judge import RUBRIC
    from tests.support.scripts import multi_turn_fix

    agent = iter(multi_turn_fix())
    verdict = json.dumps({"verdict": "clean", "summary": "its own Triton kernel", "quotes": []})

    def reply(body):
        return Reply(content=verdict, **TOKENS) if body["messages"][0].get("content") == RUBRIC else next(agent)

    with FakeProvider(reply) as fp:
        model_yaml(tmp_path / "conf", "fake-agent", "openai/fake-agent", fp.base_url, prices=PRICES)
        proc = sweep(tmp_path / "conf", tmp_path / "outputs", "model=fake-agent", "audit.judge=null")
    assert proc.returncode == 0, proc.stderr[-2000:]
    [asked] = [r for r in fp.requests if r.json["messages"][0].get("content") == RUBRIC]
    assert "<<<FILE solution.py " in asked.json["messages"][1]["content"]
    result = results(tmp_path / "outputs")["fake-agent"]
    audited = json.loads((Path(result["folder"]) / "audit.json").read_text())
    assert audited["layers"]["judge"]["model"] == "fake-agent" and result["verdict"] == "clean"
    assert result["judge_cost_usd"] == pytest.approx(PER_CALL_USD)
