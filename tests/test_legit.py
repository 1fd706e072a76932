"""Legitimate solutions are never flagged: every file in tests/legit/ and the deck's bundled Triton solutions
(KDA's left out: its reference loop makes it the slowest grade) pass the grader on CPU with a clean verdict."""
from __future__ import annotations

from pathlib import Path

import pytest

from kbsweep.audit.cases import summary
from tests.test_exploits import REPO, run_on_cpu

LEGIT = sorted((REPO / "tests/legit").glob("*.py"))
BUNDLED = sorted(p for p in (REPO / "problems/hard").glob("*/solutions/triton.py") if p.parts[-3] != "kda")
CASES = [(p, "") for p in LEGIT] + [(p, f"hard/{p.parts[-3]}") for p in BUNDLED]


@pytest.mark.parametrize("path, problem", CASES, ids=[p.stem for p in LEGIT] + [f"bundled-{p.parts[-3]}" for p in BUNDLED])
def test_legit_solution_is_clean(path: Path, problem: str, tmp_path, cases_home):
    _, result, audited = run_on_cpu(path, tmp_path, cases_home, problem)
    assert result["outcome"] == "pass", summary(result, audited)
    assert audited["verdict"] == "clean", summary(result, audited)
