"""Scoring: a shape's achieved FLOP/s and bytes/s over the GPU's roofline, geomean over shapes, the stored form of scored records, measured peaks. Imports: records, config."""
