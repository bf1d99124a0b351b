"""Worker programs of the ``peers`` scenario, one module per framework.

They run in a throwaway virtualenv that has only that framework (see
``benchmarks/peers.py``), as ``python -m benchmarks.peer_workers.<module>`` with the
checkout on ``sys.path``: they import neither streamwork nor the rest of the harness. Each
enqueues ``--jobs`` jobs (untimed), prints one JSON line ``{"event": "start", ...}`` on
stdout just before it starts its worker, and then serves until the harness ends it; every
job's handler does one ``INCR`` of ``--counter`` on its own Redis client.
"""
