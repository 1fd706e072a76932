"""The sandbox stage: confining processes (docs/sandbox.md).

An agent's commands and the grading processes run under bubblewrap (:mod:`~kbsweep.sandbox.confine`; pid 1 in
there is :mod:`~kbsweep.sandbox.init`, which holds nothing of bubblewrap's command line), with their
only ways out (a relay and an allow-list proxy, :mod:`~kbsweep.sandbox.net`), a watch on what they use (memory,
disk: :mod:`~kbsweep.sandbox.usage`, stopped by :mod:`~kbsweep.sandbox.watch`) and an environment without secrets (:mod:`~kbsweep.sandbox.secret_env`).

Rank 3 of the layout (docs/architecture.md; the ranks live in tests/test_layout.py): imports score, config and the records (in practice the records only).
"""
