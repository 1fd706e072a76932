"""gpu= must name the card a grade runs on: `kbsweep grade` and `kbsweep regrade` refuse another card (or none) in one
line before anything is graded, a sweep's cell ends as an infra outcome before its agent runs, and a CPU config is
never checked. NVML cannot run here, so the GPUs found are faked as list_gpus returns them (tests/test_launch.py
fakes them the same way)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from omegaconf import OmegaConf

import kbsweep.cell as cell_stage
from kbsweep import KbsweepError
from kbsweep.api import grade
from kbsweep.config import gpus
from kbsweep.config.gpus import GpuSpec, gpu_mismatch
from kbsweep.launch import regrade, sweep
from kbsweep.outcomes import Outcome
from kbsweep.planner.matrix import cell_dir
from kbsweep.tracking.tracker import env_params, outcome_class
from tests.conftest import REPO
from tests.test_tracking import make_cell

pytestmark = pytest.mark.fast

H100 = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaa-0"}
H200 = {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-bbbb-1"}


def spec(name: str) -> GpuSpec:
    return GpuSpec(**OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "gpu" / f"{name}.yaml")))


@pytest.fixture
def found(monkeypatch):
    """Sets the GPUs NVML finds (every one visible); returns the setter."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return lambda *listed: monkeypatch.setattr(gpus, "list_gpus", lambda: list(listed))


def test_the_card_named_passes_and_cuda_visible_devices_picks_the_pool():
    assert gpu_mismatch(spec("h100"), [H100], None) is None
    assert gpu_mismatch(spec("h200"), [H100, H200], "1") is None  # the H100 is not this process's
    mixed = gpu_mismatch(spec("h200"), [H100, H200], None)  # a grade may take either
    assert "GPU 0 here is 'NVIDIA H100 80GB HBM3'" in mixed


def test_a_cpu_config_is_never_checked_against_a_card():
    for listed in ([], [H100]):
        assert gpu_mismatch(spec("cpu"), listed, None) is None


def test_an_h100_graded_as_h200_is_one_line_naming_both_before_any_grade(found, outputs, monkeypatch, tmp_path):
    found(H100)
    monkeypatch.setattr(cell_stage, "configured_grader", lambda *args: pytest.fail("a grade started"))
    solution = tmp_path / "mine.py"
    solution.write_text("")  # never read: the refusal comes first
    with pytest.raises(KbsweepError) as refused:
        grade("demo/scale_shift", str(solution), "gpu=h200")
    line = str(refused.value)
    assert (
        "\n" not in line and "'NVIDIA H200'" in line and "'NVIDIA H100 80GB HBM3'" in line and "use gpu=auto" in line
    ), line


def test_a_gpu_config_without_a_gpu_is_refused_with_gpu_cpu(found, outputs, monkeypatch, tmp_path):
    found()
    monkeypatch.setattr(cell_stage, "configured_grader", lambda *args: pytest.fail("a grade started"))
    solution = tmp_path / "mine.py"
    solution.write_text("")  # never read: the refusal comes first
    with pytest.raises(KbsweepError, match=r"gpu=h100 .*'NVIDIA H100 80GB HBM3'.* no GPU is visible here; use gpu=cpu"):
        grade("demo/scale_shift", str(solution), "gpu=h100")


def test_a_regrade_on_another_card_is_refused_before_it_grades(found, monkeypatch):
    found(H100)
    monkeypatch.setattr(regrade, "runs_frame", lambda *args: None)
    monkeypatch.setattr(
        regrade, "latest_per_cell", lambda frame: [{"track": "hard", "run_id": "r", "problem": "hard/topk"}]
    )
    monkeypatch.setattr(regrade, "Tracker", lambda *args: pytest.fail("the regrade went on"))
    conf = {
        "tracking": {"uri": "sqlite:///none"},
        "sweep": {"name": "s"},
        "gpu": dataclasses.asdict(spec("h200")),
        "track": {"name": "hard"},
    }
    with pytest.raises(KbsweepError, match="'NVIDIA H200'.*'NVIDIA H100 80GB HBM3'.*use gpu=auto"):
        regrade.regrade_sweep(conf, force=False)


def test_a_regrade_without_a_gpu_is_refused_with_gpu_cpu_whatever_the_store_holds(found, monkeypatch):
    found()
    monkeypatch.setattr(regrade, "runs_frame", lambda *args: None)
    monkeypatch.setattr(
        regrade, "latest_per_cell", lambda frame: []
    )  # nothing to regrade: the card is still the fault named
    conf = {
        "tracking": {"uri": "sqlite:///none"},
        "sweep": {"name": "s"},
        "gpu": dataclasses.asdict(spec("h200")),
        "track": {"name": "hard"},
    }
    with pytest.raises(KbsweepError, match="gpu=h200 .*no GPU is visible here; use gpu=cpu"):
        regrade.regrade_sweep(conf, force=False)


def test_a_cell_on_another_card_is_an_infra_outcome_the_sweep_reruns_before_its_agent(found, store, monkeypatch):
    """The cell asks on the node that grades it: its agent never runs nor is paid for, its result names both cards
    and has no score; the sweep logs it unfinished and its next run runs it again."""
    found(H100)
    outputs, uri = store
    monkeypatch.setattr(cell_stage, "run_agent", lambda *args: pytest.fail("the agent ran"))
    cell = dataclasses.replace(make_cell(outputs), gpu=spec("h200"))
    tracking = {"uri": uri, "artifact_root": str(outputs / "mlartifacts"), "trace_spans": "artifact"}
    assert sweep.run_sweep([cell], tracking, {"kind": "inline"}, force=False) == [cell]
    result = json.loads((cell_dir(cell) / "result.json").read_text())
    assert result["outcome"] == Outcome.GPU_MISMATCH == "gpu_mismatch" and result.get("score") is None, result
    assert "'NVIDIA H200'" in result["message"] and "'NVIDIA H100 80GB HBM3'" in result["message"], result
    assert Outcome.GPU_MISMATCH.is_infra and outcome_class(result["outcome"]) == "infra"
    todo, _, _ = sweep.plan([cell], {}, set(), force=False)
    assert todo == [cell]


def test_the_grades_cards_are_logged_beside_every_gpu_found():
    env = {"gpus": [H100, H200], "graded_on": [{"visible": "1", "uuid": H200["uuid"], "name": H200["name"]}]}
    assert env_params(env)["env.graded_on"] == "1: NVIDIA H200"
    assert gpus.pool_devices([H100, H200], "1") == env["graded_on"]
