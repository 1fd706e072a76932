"""What both sides of a grade import: shared memory (arena), the JSON channel, failures, the batch timer, the profiler session, the zygote's in-sandbox loop. Imports: records only."""
