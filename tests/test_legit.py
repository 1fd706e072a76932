"""Legitimate solutions are never flagged: every file in tests/legit/ and the deck's bundled Triton solutions
(KDA's left out: its reference loop makes it the slowest grade) pass a full grade on CPU (timed, so the audit reads
the timed calls' evidence as a sweep's final grade does) with a score, a clean verdict and no finding that implies
a verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbsweep.audit.cases import run_case, summary
from tests.support.grading import CPU
from tests.test_exploits import REPO

LEGIT = sorted((REPO / "tests/legit").glob("*.py"))
BUNDLED = sorted(p for p in (REPO / "problems/hard").glob("*/solutions/triton.py") if p.parts[-3] != "kda")
CASES = [pytest.param(p, "", id=p.stem) for p in LEGIT] + [
    pytest.param(p, f"hard/{p.parts[-3]}", id=f"bundled-{p.parts[-3]}") for p in BUNDLED
]
# one host batch of calls per shape: a CPU grade's figures check the plumbing, and the audit reads those calls
ONE_BATCH = {"min_runs": 1, "max_runs": 1}


@pytest.mark.parametrize("path, problem", CASES)
def test_legit_solution_is_clean(path: Path, problem: str, tmp_path, cases_home, roofline):
    _, result, audited = run_case(
        path, tmp_path, CPU, roofline, REPO / "problems", problem, mode="full", timing=ONE_BATCH, shared=cases_home
    )
    assert result["outcome"] == "pass", summary(result, audited)
    assert audited["verdict"] == "clean", summary(result, audited)
    assert not [f for f in audited["findings"] if f["verdict"]], summary(result, audited)
    assert result["score"] is not None, summary(result, audited)
