"""The score stage: a grade's figures over the GPU's roofline.

A shape's achieved FLOP/s and bytes/s as fractions of the datasheet peaks, the geomean over shapes and the speedups
(:mod:`~kbsweep.score.roofline`), the stored form of records that carry them (:mod:`~kbsweep.score.stored`), and
measured peaks beside the datasheet's (:mod:`~kbsweep.score.calibrate`).

Rank 2 of the layout (docs/architecture.md; the ranks live in tests/test_layout.py): imports config and the records.
"""
