"""The scored time is the referee's own measurement: a candidate that rewrites what its process reports (call
times, the batch it answers, when it answers) or reorders its work within a batch gains nothing on the scored
figure. Every case in tests/referee_cases costs 10 ms of host time a call when honest; each forging one is graded
beside the honest twin in the same test, and either does not pass with a score or scores no faster than it."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.grading import CPU, graded

CASES = Path(__file__).parent / "referee_cases"
FORGERIES = sorted(p.stem for p in CASES.glob("*.py") if p.stem != "honest_sleep")
TIMING = {"min_runs": 16, "max_runs": 16, "max_time_s": 5.0}  # two batches of 8 calls a shape, whatever the error


def shape_ms(result):
    return [s["ms"] for s in result["shapes"]]


@pytest.fixture(scope="module")
def honest(problem, roofline, tmp_path_factory):
    result = graded(problem, CASES / "honest_sleep.py", CPU, roofline, baselines=[], timing=TIMING, log_dir=tmp_path_factory.mktemp("honest"))
    assert result["outcome"] == "pass" and result["score"] is not None, result.get("message")
    assert all(ms >= 10.0 for ms in shape_ms(result))  # the referee's clock sees at least the sleep
    return result


@pytest.mark.parametrize("case", FORGERIES)
def test_a_forged_report_gains_nothing_on_the_scored_time(problem, roofline, tmp_path, honest, case):
    result = graded(problem, CASES / f"{case}.py", CPU, roofline, baselines=[], timing=TIMING, log_dir=tmp_path)
    if result["outcome"] == "pass" and result["score"] is not None:
        for forged, fair in zip(shape_ms(result), shape_ms(honest)):
            assert forged >= 0.9 * fair, (case, shape_ms(result), shape_ms(honest))


def test_the_runner_forging_its_times_is_a_finding_and_the_answer_before_the_work_fails(problem, roofline, tmp_path):
    forged = graded(problem, CASES / "slow_on_empty.py", CPU, roofline, baselines=[], timing=TIMING, log_dir=tmp_path / "a")
    assert "time_disagreement" in {f["kind"] for f in forged["findings"]} and forged["score"] is None
    early = graded(problem, CASES / "answer_early.py", CPU, roofline, baselines=[], timing=TIMING, log_dir=tmp_path / "b")
    assert early["outcome"] == "incorrect", early.get("message")
