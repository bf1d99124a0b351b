"""The worker classes the tests run, in-process or as ``streamwork run tests.workers.MODULE:NAME``
in child processes: one module per family (ledger, ops, nemesis ...)."""
