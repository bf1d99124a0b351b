"""The scaling study, ``python -m benchmarks --scaling``: how streamwork's cost grows with
the work (see *Other studies* in ``benchmarks/README.md``).

    sizes.py   the points of a full and of a ``--quick`` run
    load.py    1-3: backlog size, streams served by one process, payload size
    procs.py   4: worker processes; 5: one worker process's RSS over a soak
    memory.py  5: Redis bytes per done record, pending entry, dead letter; 6: the trimmer
    run.py     run_scaling(): every section on one private redis-server, and the ops hook
    report.py  its tables and plots
"""
