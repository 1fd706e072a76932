"""The agent stage: a model works a problem in a workspace through tools until it stops.

The tool-calling loop (:mod:`~kbsweep.agent.loop`) and its tools, the models and their providers, retries, and the
transcript with its exports.

Rank 4 of the layout (docs/architecture.md; the ranks live in tests/test_layout.py): imports sandbox (the tools' commands run confined) and the stages below it.
"""
