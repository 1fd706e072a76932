"""The grader's seam: results stored by earlier versions load as a GradeResult and are written back as they were;
one GradeRequest from config serves cells, ``kbsweep grade`` and ``kbsweep regrade`` alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kbsweep.config.gpus import GpuSpec
from kbsweep.grader.referee.request import RefereeRequest
from kbsweep.grader.request import GradeRequest
from kbsweep.grader.result import GradeResult
from kbsweep.outcomes import Outcome

pytestmark = pytest.mark.fast

STORED = Path(__file__).parent / "support/stored_grades"


def test_a_stored_failure_round_trips_key_for_key():
    stored = json.loads((STORED / "demo_incorrect_2026-12-04.json").read_text())
    result = GradeResult.from_json(stored)
    assert result.outcome is Outcome.INCORRECT and not result.passed and result.score is None
    assert list(result.to_json().items()) == list(stored.items())  # the same keys, in the same order
    assert json.dumps(result.to_json()) == json.dumps(stored)


def test_an_older_kernelbench_pass_loads_with_its_verdicts():
    """Written before grades recorded their time limit and start-up: those read as None, nothing else moves."""
    stored = json.loads((STORED / "kernelbench_pass_2026-12-03.json").read_text())
    assert "timeout_s" not in stored and "startup_s" not in stored
    result = GradeResult.from_json(stored)
    assert result.passed and result.basis == stored["basis"] and result.speedup == stored["speedup"]
    assert (
        result.verdicts == {"kernelbench": "correct", "kbsweep": "pass"} and result.kernelbench["correctness"] is True
    )
    written = result.to_json()
    assert {key: written[key] for key in stored} == stored
    assert written["timeout_s"] is None and written["startup_s"] is None


def test_keys_of_a_newer_result_are_kept():
    stored = {**json.loads((STORED / "demo_incorrect_2026-12-04.json").read_text()), "cost_usd": 0.25}
    assert GradeResult.from_json(stored).to_json() == stored


def test_one_request_from_config(problem, roofline, tmp_path):
    """The track's time limit, world size and sandbox, the GPU's baselines, the grade section's timing and the
    baseline cache under outputs/: what a cell, ``kbsweep grade`` and ``kbsweep regrade`` all grade with."""
    gpu = GpuSpec("cpu", "a CPU", "cpu", device="cpu", shape_set="smoke_shapes", baselines=["eager"])
    track = {"name": "demo", "grade_timeout_s": 240, "world_size": 1, "sandbox": {"mode": "unsafe"}}
    grade = {
        "baselines": ["eager", "compile"],
        "memory_mib": 2048,
        "timing": {"min_runs": 3},
        "compile_mode": "default",
        "timers": None,
    }
    paths = {"outputs": str(tmp_path / "outputs"), "problems": [str(tmp_path / "problems")]}
    configured = GradeRequest.from_config(problem, roofline, gpu, track, grade, paths, hide_env=["SECRET_NAME"])
    assert configured.timeout_s == 240 and configured.world_size == 1 and configured.sandbox.mode == "unsafe"
    assert (
        configured.baselines == ["eager"]
        and configured.timing == {"min_runs": 3}
        and configured.hide_env == ("SECRET_NAME",)
    )
    assert configured.baseline_cache.path == tmp_path / "outputs/baselines/cpu.json"
    assert configured.zygote_home == (tmp_path / "outputs/zygotes").resolve()
    full = configured.of("full", tmp_path / "solution.py", tmp_path / "grades/final")
    check = configured.of("check", tmp_path / "solution.py", tmp_path / "grades/check-1")
    assert full.baselines == ["eager"] and check.baselines == [] and check.baseline_cache is configured.baseline_cache
    assert (full.mode, full.log_dir) == ("full", tmp_path / "grades/final")


def test_the_runner_gets_three_fields_of_the_referee_request():
    request = RefereeRequest(
        spec={},
        reference="/deck/reference.py",
        solution="/c/solution.py",
        workdir="/c",
        device="cpu",
        shapes=[],
        mode="check",
        baselines=[],
        compile_mode=None,
        l2_bytes=1 << 20,
        timing={},
        baseline_budget_s=1.0,
        secret_seed=1234,
        world_size=1,
        timers=[],
    )
    assert request.for_runner() == {"device": "cpu", "workdir": "/c", "l2_bytes": 1 << 20}
    assert RefereeRequest(**json.loads(json.dumps(request.to_json()))) == request
