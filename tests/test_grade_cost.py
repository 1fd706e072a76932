"""scripts/grade_cost.py: a grade's wall split by stage, cold and warm, with each baseline's source (the script grades
on a GPU or, with --gpu cpu, as a dry run of the same path; these tests hold its arithmetic)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent


def script():
    spec = importlib.util.spec_from_file_location("grade_cost", REPO / "scripts/grade_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def result(baselines_s: float, source: str) -> dict:
    stages = {
        "load_reference": 0.1,
        "baselines": baselines_s,
        "import_candidate": 4.0,
        "correctness": 2.0,
        "timing": 3.0,
        "audit": 0.5,
    }
    grade_s = 1.5 + sum(stages.values()) + 0.4
    eager = {
        "median_ms": 0.14,
        "runs": 6,
        "cost_s": {"check": 0.0, "timing": 1.2},
        "record": {"source": source, "key": "k"},
    }
    return {
        "outcome": "pass",
        "score": 0.4,
        "grade_s": grade_s,
        "startup_s": 1.5,
        "env": {"torch": "2.11", "graded_on": []},
        "evidence": {"stages": {name: {"s": s} for name, s in stages.items()}},
        "timings": [{"shape": {"rows": 8}, "baselines": {"eager": eager, "sota": None}}],
    }


def test_a_grade_is_split_into_stages_that_add_up_to_its_wall():
    gc = script()
    cold, warm = gc.breakdown(result(44.0, "timed"), 60.0), gc.breakdown(result(0.0, "cache"), 20.0)
    for got, wall in ((cold, 60.0), (warm, 20.0)):
        stages = got["stages"]
        assert set(stages) == set(gc.STAGES)
        assert (
            sum(v for k, v in stages.items() if k != "wall") == pytest.approx(wall, abs=0.01) and stages["wall"] == wall
        )
        assert (stages["startup"], stages["import"], stages["correctness"], stages["timing"], stages["audit"]) == (
            1.5,
            4.0,
            2.0,
            3.0,
            0.5,
        )
        assert stages["rest"] == pytest.approx(0.4) and stages["cli"] == pytest.approx(wall - got["grade_s"])
    assert (cold["stages"]["baselines"], warm["stages"]["baselines"]) == (44.0, 0.0)
    assert cold["baselines"] == [
        {
            "shape": {"rows": 8},
            "baseline": "eager",
            "source": "timed",
            "median_ms": 0.14,
            "runs": 6,
            "cost_s": {"check": 0.0, "timing": 1.2},
        }
    ]
    assert (
        warm["baselines"][0]["source"] == "cache" and warm["baselines"][0]["cost_s"] is None
    )  # a served record cost this grade nothing
    assert cold["card"] == ["cpu"]


def test_medians_per_checkout_problem_and_state():
    gc = script()
    rows = [
        {"repo": "a", "problem": "demo/scale_shift", "state": state, **gc.breakdown(result(b, src), wall)}
        for state, b, src, wall in (
            ("cold", 40.0, "timed", 60.0),
            ("cold", 44.0, "timed", 64.0),
            ("cold", 42.0, "timed", 70.0),
            ("warm", 0.0, "cache", 20.0),
        )
    ]
    summary = gc.medians(rows)
    assert set(summary) == {"a demo/scale_shift cold", "a demo/scale_shift warm"}
    assert (
        summary["a demo/scale_shift cold"]["baselines"] == 42.0 and summary["a demo/scale_shift cold"]["wall"] == 64.0
    )
    assert "baselines" in gc.table(summary).splitlines()[0]
