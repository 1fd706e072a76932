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
