"""The scored time is the referee's own measurement: a candidate that rewrites what its process reports (call
times, the batch it answers, when it answers) or moves its work within a batch gains nothing on the scored figure.
Every case in tests/referee_cases sleeps 10 ms a call, on every call or (compute_ahead) all of a batch's in its
first call, unless (incremental_update) a call's input nearly repeats the last one's, then runs its own Triton
kernel (tests/exploits/_demo_kernels.py, staged beside it): whatever it reports, a figure under that sleep is forged
or reused work. With a kernel of their own, no other finding blanks their score: honest_sleep keeps its score, and
a report of more time than the referee's clock saw loses it to the clock's rule alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.grading import CPU, graded

CASES = Path(__file__).parent / "referee_cases"
COST_MS = 10.0
TIMING = {"min_runs": 16, "max_runs": 16, "max_time_s": 5.0}  # two batches of 8 calls a shape, whatever the error


KERNELS = Path(__file__).parent / "exploits/_demo_kernels.py"


def grade_case(problem, roofline, tmp_path, case):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    shutil.copy2(KERNELS, workspace / KERNELS.name)
    shutil.copy2(CASES / f"{case}.py", workspace / "solution.py")
    return graded(
        problem, workspace / "solution.py", CPU, roofline, baselines=[], timing=TIMING, log_dir=tmp_path / "grade"
    )


@pytest.mark.parametrize("case", sorted(p.stem for p in CASES.glob("*.py") if p.stem != "answer_early"))
def test_the_scored_figure_never_reads_under_the_work_done(problem, roofline, tmp_path, case):
    result = grade_case(problem, roofline, tmp_path, case)
    assert result["outcome"] == "pass", result.get("message")  # each does the work: only its reports are forged
    assert result["shapes"] and all(s["ms"] >= 0.95 * COST_MS for s in result["shapes"]), [
        s["ms"] for s in result["shapes"]
    ]


def test_the_runner_reporting_more_than_the_referee_saw_is_a_finding(problem, roofline, tmp_path):
    """Figures 5x over the referee's: work its clock never saw. (Figures under it, slow_on_empty's and slowed_clock's,
    gain nothing, the score being the referee's: the first test holds their figures to their work.)"""
    forged = grade_case(problem, roofline, tmp_path, "inflated_report")
    assert [f["kind"] for f in forged["findings"]] == ["time_disagreement"] * len(forged["shapes"]) and forged[
        "score"
    ] is None


def test_the_honest_twin_keeps_its_score(problem, roofline, tmp_path):
    honest = grade_case(problem, roofline, tmp_path, "honest_sleep")
    assert honest["outcome"] == "pass" and honest["findings"] == [] and honest["score"] is not None, honest["findings"]


def test_the_answer_before_the_work_fails(problem, roofline, tmp_path):
    early = grade_case(problem, roofline, tmp_path, "answer_early")
    assert early["outcome"] == "incorrect", early.get("message")


def test_a_batch_never_has_more_taken_off_than_it_spent_outside_the_runners_loop():
    """The trusted round trip is subtracted only up to what the batch's own wall held outside the runner's loop:
    a runner that reports a longer loop (or none) only has less taken off, never more."""
    from types import SimpleNamespace

    from kbsweep.grader.referee.timing_stage import TimingStage

    stage = SimpleNamespace(round_trip_ms=0.5)
    null = lambda **batch: TimingStage.batch_null(stage, 2.0, {"wall_ms": 10.0, "copy_ms": 1.0, **batch})  # noqa: E731
    assert null(loop_ms=8.7) == pytest.approx(1.8)  # 0.3 ms outside the loop: that much of the round trip
    assert null(loop_ms=8.0) == pytest.approx(2.0)  # 1 ms outside: the whole round trip
    assert null(loop_ms=12.0) == pytest.approx(1.5)  # a loop longer than the wall: none of it
    assert null(loop_ms=None) == pytest.approx(2.0)
    assert all(null(loop_ms=loop) <= 2.0 for loop in (0.0, 5.0, 8.7, 9.5, 100.0))
