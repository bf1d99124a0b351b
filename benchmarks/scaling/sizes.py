"""The sizes of the scaling study (``python -m benchmarks --scaling [--quick]``): the full
run's points, and tiny ones for ``--quick`` (the end-to-end test)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: every point runs the worker as a user gets it: the default concurrency and batch size
CONCURRENCY: Final = 16
BATCH_SIZE: Final = 100
#: payload sizes with the bench's paddings are kept below this body limit
MAX_PAYLOAD_BYTES: Final = 2 * 1024 * 1024
#: bytes one pipeline / send_many call / read of the payload runs may carry (1 MB jobs: 4)
PIPELINE_BYTES: Final = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ScalingSizes:
    """The points of one scaling run."""

    quick: bool
    backlogs: tuple[int, ...]  #: jobs waiting in the stream (section 1)
    stream_counts: tuple[int, ...]  #: streams served by one process (section 2)
    streams_jobs: int  #: jobs spread over those streams, the same total at every count
    payloads: tuple[tuple[int, int], ...]  #: (payload bytes, jobs) (section 3)
    processes: tuple[int, ...]  #: worker processes (section 4)
    processes_jobs: int
    memory_jobs: int  #: done records / pending entries / dead letters sampled (section 5)
    soak_jobs: int  #: jobs through one worker process while its RSS is sampled
    soak_samples: int  #: RSS samples over the soak
    trim_sizes: tuple[int, ...]  #: entries in the stream the trimmer steps over (section 6)
    idle_seconds: float  #: how long the many-streams process is watched idle
    streams_limit: float  #: s a many-streams run may take; past it, the row says how far
    ops_stream_counts: tuple[int, ...]  #: the dashboard / inspect hook (ops_scale.py)

    @classmethod
    def make(cls, quick: bool = False) -> ScalingSizes:
        if quick:
            return cls(quick=True, backlogs=(200, 1000), stream_counts=(1, 4),
                       streams_jobs=200, payloads=((100, 60), (10_000, 30), (100_000, 10),
                                                   (1_000_000, 3)),
                       processes=(1, 2), processes_jobs=3000, memory_jobs=200,
                       soak_jobs=2000, soak_samples=10, trim_sizes=(2000,),
                       idle_seconds=0.3, streams_limit=60.0, ops_stream_counts=(3,))
        return cls(quick=False, backlogs=(10_000, 100_000, 1_000_000),
                   stream_counts=(1, 10, 100, 1000), streams_jobs=100_000,
                   payloads=((100, 20_000), (10_000, 10_000), (100_000, 2_000),
                             (1_000_000, 300)),
                   processes=(1, 2, 4), processes_jobs=200_000, memory_jobs=10_000,
                   soak_jobs=1_000_000, soak_samples=50, trim_sizes=(100_000, 1_000_000),
                   idle_seconds=3.0, streams_limit=120.0,
                   ops_stream_counts=(100, 2000))
