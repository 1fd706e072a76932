"""The plan stage: composed configs become cells.

Cells with stable keys (:mod:`~kbsweep.planner.matrix`), plan-time validation (:mod:`~kbsweep.planner.validate`)
and model preflight (:mod:`~kbsweep.planner.preflight`), the plan verb's record (:mod:`~kbsweep.planner.planning`).
Not ``plan``: that name is the API function ``kbsweep.plan``.

Rank 7 of the layout (docs/architecture.md; the ranks live in tests/test_layout.py): imports grader and the stages
below it (in practice harness, agent, score, config and the records).
"""
