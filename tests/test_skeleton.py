"""The walking skeleton end to end: composition, validation, plan, the default sweep, user YAML folders."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def cell_runs(outputs: Path, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{outputs}/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], filter_string="tags.`kbsweep.kind` = 'cell'")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["model=scripted", "gpu=cpu", "track=demo"], "scripted · demo/row_softmax · cpu · r0"),
        (["model=opus-4.8", "gpu=h200", "track=hard", "problem=topk"], "opus-4.8 · hard/topk · h200 · r0"),
        (["gpu=h100", "track=demo", "problem=scale_shift", "repeat=2"], "scripted · demo/scale_shift · h100 · r2"),
    ],
)
def test_groups_compose(cli, outputs, overrides, expected):
    proc = cli("plan", *overrides)
    assert proc.returncode == 0, proc.stderr
    assert expected in proc.stdout


def test_plan_counts_a_multirun_and_estimates_cost(cli, outputs):
    proc = cli("plan", "-m", "model=scripted,scripted-lazy", "problem=scale_shift,row_softmax", "repeat=0,1,2")
    assert proc.returncode == 0, proc.stderr
    assert "12 cells" in proc.stdout
    proc = cli("plan", "-m", "model=opus-4.8,glm-5.2", "gpu=h100", "track=hard")
    assert proc.returncode == 0, proc.stderr
    assert "12 cells" in proc.stdout and "GPU-h" in proc.stdout
    assert "36.0 GPU-h" in proc.stdout  # 12 cells × 3 h cap


def test_plan_is_fast(cli, outputs):
    started = time.monotonic()
    assert cli("plan").returncode == 0
    assert (
        time.monotonic() - started < 6
    )  # loose here (a loaded 2-core box); docs/benchmarks.md records the real figure


def write(folder: Path, relative: str, text: str) -> Path:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "relative, text, needle",
    [
        ("model/typo.yaml", "name: typo\nprovider: scripted\npricez: {input: 1}\n", "model/typo.yaml: key 'pricez'"),
        ("model/badtype.yaml", "name: badtype\ncontext_window: lots\n", "model/badtype.yaml: key 'context_window'"),
        ("gpu/nameless.yaml", "description: x\nroofline: h200\n", "gpu/nameless.yaml: key 'name'"),
        ("model/broken.yaml", "name: [unclosed\n", "model/broken.yaml:2:1: key 'name': broken YAML"),
    ],
)
def test_config_errors_are_one_line_naming_file_and_key(cli, outputs, tmp_path, relative, text, needle):
    user = tmp_path / "userconf"
    write(user, relative, text)
    group, name = relative[:-5].split("/")
    proc = cli("plan", "-cd", str(user), f"{group}={name}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_model_and_problem_are_clear(cli, outputs):
    proc = cli("plan", "model=nope-9")
    assert proc.returncode != 0 and "Could not find 'model/nope-9'" in proc.stderr
    proc = cli("plan", "problem=nope")
    assert proc.returncode == 2 and "problem nope is not in track 'demo'" in proc.stderr


def test_bad_problem_spec_is_one_line(cli, outputs, tmp_path):
    problems = tmp_path / "problems"
    write(problems, "demo/bad/problem.yaml", "regime: compute\nflops: 'M*'\nshapes: [{M: 1}]\n")
    write(problems, "demo/bad/reference.py", "")
    proc = cli("plan", f"paths.problems=[{REPO}/problems,{problems}]", "problem=bad")
    assert proc.returncode == 2
    assert "demo/bad: formula 'M*' fails" in proc.stderr


def test_user_folder_adds_a_gpu_without_reinstalling(cli, outputs, tmp_path):
    user = tmp_path / "userconf"
    write(user, "gpu/mi300x.yaml", 'name: mi300x\ndescription: "AMD MI300X"\nroofline: h200\nhourly_usd: 2.0\n')
    proc = cli("plan", "-cd", str(user), "-m", "gpu=mi300x,h100", "problem=scale_shift")
    assert proc.returncode == 0, proc.stderr
    assert "scripted · demo/scale_shift · mi300x · r0" in proc.stdout
    assert "scripted · demo/scale_shift · h100 · r0" in proc.stdout


def test_default_sweep_end_to_end(cli, outputs):
    proc = cli()
    assert proc.returncode == 0, proc.stderr
    assert "kbsweep leaderboard — demo / cpu" in proc.stdout
    runs = cell_runs(outputs, "demo")
    assert len(runs) == 2
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.tags["outcome"] == "pass" and run.data.tags["verdict"] == "clean"
        assert 0 < run.data.metrics["score"] < 1
        assert run.data.metrics["turns"] == 7


def test_multirun_two_models_two_problems(cli, outputs):
    proc = cli("-m", "model=scripted,scripted-lazy", "problem=scale_shift,row_softmax", "launcher.concurrency=2")
    assert proc.returncode == 0, proc.stderr
    runs = cell_runs(outputs, "demo")
    outcomes = {(r.data.tags["model"], r.data.tags["problem"]): r.data.tags["outcome"] for r in runs}
    assert outcomes == {
        ("scripted", "demo/scale_shift"): "pass",
        ("scripted", "demo/row_softmax"): "pass",
        ("scripted-lazy", "demo/scale_shift"): "incorrect",
        ("scripted-lazy", "demo/row_softmax"): "incorrect",
    }
    [parent] = {r.data.tags["mlflow.parentRunId"] for r in runs}  # one sweep invocation
    # the launcher's settings are the invocation's, logged once on its run
    from mlflow.tracking import MlflowClient

    sweep_params = MlflowClient(f"sqlite:///{outputs}/mlflow.db").get_run(parent).data.params
    assert sweep_params["launcher.concurrency"] == "2" and sweep_params["launcher"] == "local"
    assert not any(k.startswith("launcher") for k in runs[0].data.params)
