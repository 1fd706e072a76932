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
    missing = sorted({str(p.relative_to(REPO)) for p in named_paths(doc) if not p.exists() and not p.name.startswith(EXAMPLES)})
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"
