"""Docs match the code: every repository path the README and docs/ name, in backticks or as a link, exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP = ("kbsweep", "scripts", "docs", "problems", "conf", "tests", "roofline_specs", "baselines")
NAMED = re.compile(r"`((?:%s)/[\w./-]+)`" % "|".join(TOP))
LINKED = re.compile(r"\]\(([\w./-]+)\)")
EXAMPLES = ("my_",)  # files a reader is told to create


def named_paths(doc: Path):
    text = doc.read_text()
    for match in NAMED.finditer(text):
        yield REPO / match.group(1).rstrip(".")
    for match in LINKED.finditer(text):
        yield (doc.parent / match.group(1)).resolve()


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_named_path_exists(doc):
    missing = sorted(
        {str(p.relative_to(REPO)) for p in named_paths(doc) if not p.exists() and not p.name.startswith(EXAMPLES)}
    )
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


WORK_PERIOD = re.compile(r"session ?\d+|_s\d+_|device call \d+|call\d+_|run \d+ of session", re.I)


def test_benchmarks_keeps_current_figures():
    """docs/benchmarks.md holds the current figures; earlier runs go to a note in docs/data (it had grown to 730 lines)."""
    lines = len((REPO / "docs" / "benchmarks.md").read_text().splitlines())
    assert lines <= 550, f"docs/benchmarks.md has {lines} lines: move earlier runs to docs/data/benchmarks_history.md"


def test_data_notes_name_the_commit_date_and_card_not_a_work_period():
    """A measurement is named by what it measured (commit, date, card, host), never by numbered work periods or
    calls, which no reader can look up: in docs/data's file names and contents and the docs."""
    data = REPO / "docs" / "data"
    named = [p.name for p in data.iterdir() if WORK_PERIOD.search(p.name)]
    said = [
        f"{p.name}: {m.group(0)!r}"
        for p in sorted(data.iterdir())
        if p.suffix in (".json", ".md", ".txt")
        for m in [WORK_PERIOD.search(p.read_text(errors="replace"))]
        if m
    ]
    said += [f"{doc.name}: {m.group(0)!r}" for doc in DOCS for m in [WORK_PERIOD.search(doc.read_text())] if m]
    assert named == [] and said == [], named + said
