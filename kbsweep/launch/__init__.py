"""The launch stage: cells to an executor (inline, local, Slurm), the sweep orchestrator and its resume rules, regrades. Imports: kbsweep.cell and below."""
