"""The runner: the candidate's process (docs/grading.md, threat model).

The runner (:mod:`~kbsweep.grader.runner.runner`), the import hook that finds the candidate's helpers, and what it
installs before the candidate is imported: the monitor and kernel gate (:mod:`~kbsweep.grader.runner.runtime`),
the seals, the audit events they listen for, and Triton's interpreter cache.

Inside grader (rank 6; tests/test_layout.py): imports only ``grader.shared`` and the records; never the
referee, its request, the orchestrator, config, sandbox, audit, agent or tracking (nothing that holds a secret).
"""
