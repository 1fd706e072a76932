"""The tracking stage: MLflow holds every sweep and cell.

The writer (:mod:`~kbsweep.tracking.tracker`), the store and its readers (:mod:`~kbsweep.tracking.mlflow_store`),
its last-read snapshot, live progress, and the cell journal that resume reads and tracking logs
(:mod:`~kbsweep.tracking.cell_result`).

Rank 8 of the layout (docs/architecture.md; the ranks live in tests/test_layout.py): imports planner and the stages below it.
"""
