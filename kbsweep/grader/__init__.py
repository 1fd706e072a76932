"""The grading stage: one grade of one candidate, in two sandboxed processes, scored (docs/grading.md).

Its one job: ``grade(request)`` (:mod:`kbsweep.grader.grading`) runs the trusted referee and the candidate's runner,
each confined, and returns a :class:`~kbsweep.grader.result.GradeResult`.

Rank 6 of the layout (docs/architecture.md; the ranks live in tests/test_layout.py): imports harness and the
stages below it (in practice sandbox, score, config and the records). Inside it, the trust boundary:

* ``referee/``: the trusted process (reference, checks, clocks, the secret seed); never imports ``runner/``.
* ``runner/``: the candidate's process and what it installs before the candidate is imported; imports only
  ``shared/`` and the records.
* ``shared/``: what both processes import; imports only the records.
* the modules here: the orchestrator's side (requests, processes and their zygote pool, multi-rank grades, GPU
  locks, results, baselines).

This file stays light: the runner's and the zygotes' processes run it as their parent package, so it imports
nothing and forwards the orchestrator's names (``from kbsweep.grader import grade``) on first use.
"""

FORWARDED = ("grade", "software_versions", "launch_gate")


def __getattr__(name: str):
    """``grade``, ``software_versions``, ``launch_gate``: :mod:`kbsweep.grader.grading`'s, imported on first use."""
    if name in FORWARDED:
        from kbsweep.grader import grading

        return getattr(grading, name)
    raise AttributeError(f"module 'kbsweep.grader' has no attribute {name!r}")
