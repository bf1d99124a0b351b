"""streamwork's benchmark harness: ``python -m benchmarks`` (same as ``streamwork bench``).

It lives outside the library, and only a source checkout has it; see ``benchmarks/README.md``.

    cli.py        the ``bench`` click command (``python -m benchmarks``, ``streamwork bench``)
    run.py        run_bench(): every scenario in one run, the result dict and the goals
    harness.py    the scenarios: raw redis-py baselines and streamwork, each timed once
    measure.py    parameters, timed spans (wall + CPU of both sides), medians, the jobs
    workers.py    the no-op and latency-recording workers under test
    pacing.py     a steady offered load from a producer child process (latency run)
    accounting.py Redis commands per job (commandstats, MONITOR), memory per job record
    peers.py      the peers' protocol (--peers): taskiq-redis, dramatiq, arq, rq, each in a
                  cached throwaway virtualenv, beside streamwork and the bare-handler ceiling
    peer_workers/ one small worker program per peer (run in the peer's virtualenv)
    report.py     rich tables and the matplotlib plots
    scaling/      the scaling study (--scaling): cost against backlog, streams, payload size,
                  processes; memory per item, a worker's RSS over a soak, the trimmer
    scenarios/    diagnostic tools built on the harness (profiling, GC pauses); the batch-
                  handler and recovery (after a SIGKILL) benchmarks, sections of the main run
                  that also run alone; operations over many streams (the scaling study's)
"""
