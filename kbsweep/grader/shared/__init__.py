"""What both sides of a grade import (docs/grading.md).

Shared memory (arena), the JSON channel, how a grade fails, the batch timer, the profiler session, a torchrun
rank's start, and the zygote's in-sandbox loop.

Inside grader (rank 6; tests/test_layout.py): imports only the records.
"""
