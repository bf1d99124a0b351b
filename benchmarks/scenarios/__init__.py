"""Extra benchmark scenarios and tools (profiling) built on :mod:`streamwork.bench`."""
