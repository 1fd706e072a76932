"""The launch stage: cells to an executor, the sweep that drives them, regrades (docs/launch.md).

Executors (inline, local, Slurm: :mod:`~kbsweep.launch.launchers`), warm local workers, what a submitit launcher
submits next, the sweep orchestrator with its resume rules (:mod:`~kbsweep.launch.sweep`), and regrades of stored
solutions (:mod:`~kbsweep.launch.regrade`).

Rank 11 of the layout (docs/architecture.md; the ranks live in tests/test_layout.py): imports ``kbsweep.cell`` and the stages below it.
"""
