"""The referee: the trusted side of a grade (docs/grading.md, threat model).

The referee process (:mod:`~kbsweep.grader.referee.referee`) and its input (:mod:`~kbsweep.grader.referee.request`,
the secret seed included), its stages (correctness, timing, probes) over the shared candidate context, the
comparisons, KernelBench's verdict and the reference timers. It never imports candidate code.

Inside grader (rank 6; tests/test_layout.py): imports ``grader.shared``, config, score, sandbox and the records;
never ``grader.runner`` nor the orchestrator's modules (``kbsweep/grader/*.py``).
"""
