"""The config stage: what a sweep is asked for and what it names.

The config groups' schemas and their validation (:mod:`~kbsweep.config.schema`), the command line before Hydra
(:mod:`~kbsweep.config.overrides`), Hydra's jobs turned into prepared configs (:mod:`~kbsweep.config.jobs`), GPU
specs (:mod:`~kbsweep.config.gpus`), problems and their folders (:mod:`~kbsweep.config.problems`,
:mod:`~kbsweep.config.problem_folders`) and KernelBench files as problem folders, with KernelBench's pinned eval
semantics (:mod:`~kbsweep.config.kernelbench`).

Rank 1 of the layout (docs/architecture.md; the ranks live in tests/test_layout.py): imports only the records (``kbsweep.errors``, ``paths``, ``outcomes``,
``registry``).
"""
