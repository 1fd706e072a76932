"""The Python API (kbsweep.plan/run/grade/report): typed records from the same code as the CLI's verbs; a
resumed sweep with nothing to do logs no empty sweep run."""

from __future__ import annotations

import pytest

import kbsweep
from kbsweep import ExitCode, KbsweepError
from kbsweep.api import Grade, Plan, Run
from tests.support.sweeps import KEY_ENV, REPO, model_yaml


@pytest.mark.fast
def test_plan_sweeps_comma_lists_and_names_missing_keys(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    model_yaml(tmp_path / "conf", "fake", "openai/fake", "http://127.0.0.1:9/v1")
    plan = kbsweep.plan(
        "model=scripted,fake", "gpu=cpu", "problem=scale_shift", "repeat=0,1", config_dir=str(tmp_path / "conf")
    )
    assert isinstance(plan, Plan) and len(plan.cells) == 4
    assert {(c.model, c.repeat) for c in plan.cells} == {("scripted", 0), ("scripted", 1), ("fake", 0), ("fake", 1)}
    assert plan.expected_tokens == {"fake": {"input": 2_000_000, "output": 150_000}}
    assert plan.missing_keys == [
        f"model 'fake' (openai/fake): environment variable {KEY_ENV} is not set (model/fake.yaml: api_key_env)"
    ]


@pytest.mark.fast
def test_plan_sweeps_a_glob_over_a_group():
    plan = kbsweep.plan("model=glob(scripted*)", "gpu=cpu", "problem=scale_shift")
    assert sorted(c.model for c in plan.cells) == ["scripted", "scripted-lazy"]


@pytest.mark.fast
def test_a_typo_is_the_clis_one_line_error():
    with pytest.raises(KbsweepError, match="key 'gpu': Could not find 'gpu/nope'"):
        kbsweep.plan("gpu=nope")


def test_grade_returns_the_outcome_and_result(tmp_path, monkeypatch):
    monkeypatch.setenv("KBSWEEP_OUTPUTS", str(tmp_path / "outputs"))
    grade = kbsweep.grade("demo/scale_shift", str(REPO / "problems/demo/scale_shift/solutions/wrong.py"), "gpu=cpu")
    assert isinstance(grade, Grade) and grade.outcome == "incorrect" and grade.exit_code == ExitCode.MODEL
    assert grade.result["outcome"] == "incorrect" and grade.score is None


def test_run_then_resume_with_nothing_to_do(tmp_path, monkeypatch):
    from kbsweep.tracking.mlflow_store import make_client

    monkeypatch.setenv("KBSWEEP_OUTPUTS", str(tmp_path / "outputs"))
    monkeypatch.setenv("KBSWEEP_LOCK_DIR", str(tmp_path / "locks"))
    overrides = ("model=scripted", "gpu=cpu", "problem=scale_shift", "launcher=inline")
    first = kbsweep.run(*overrides)
    assert isinstance(first, Run) and first.exit_code == ExitCode.OK and [c.model for c in first.cells] == ["scripted"]
    assert first.report.boards and first.report.files["html"].endswith("report.html")
    again = kbsweep.run(*overrides)
    assert again.unfinished == []
    client = make_client(f"sqlite:///{tmp_path / 'outputs'}/mlflow.db")
    experiment = client.get_experiment_by_name("demo")
    assert (
        len(client.search_runs([experiment.experiment_id], "tags.`kbsweep.kind` = 'sweep'")) == 1
    )  # the resume logged no empty run
