"""The report stage: boards from the tracking store, and what is made of them.

Boards (:mod:`~kbsweep.reporting.report`), their terminal, Markdown and HTML renderings, the plots, and the
dataset export. Not ``report``: that name is the API function ``kbsweep.report``.

Rank 12 of the layout (docs/architecture.md; the ranks live in tests/test_layout.py): imports launch and the
stages below it (in practice tracking, score, agent and the records).
"""
