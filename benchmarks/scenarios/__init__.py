"""Extra benchmark scenarios and tools (profiling) built on :mod:`benchmarks.harness`."""
