"""streamwork's benchmark harness: ``python -m benchmarks`` (same as ``streamwork bench``).

The harness lives in :mod:`streamwork.bench`; see ``benchmarks/README.md``.
"""
