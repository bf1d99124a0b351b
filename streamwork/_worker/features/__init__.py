"""Optional features of a worker, each behind the core's seam (`core.seam.Feature`).

`FEATURES` is the one list of them: the consumer builds each (its ``build`` says whether
the worker's options turn it on), and the worker's options are the core's plus those the
features declare. Their order is the order of their hooks: the checks before a start run
in it, and a feature early in it sees a delivery first.
"""

from __future__ import annotations

from typing import Final

from streamwork._worker.core.seam import Feature
from streamwork._worker.features.chain_outbox import ChainOutbox
from streamwork._worker.features.chains import Chains
from streamwork._worker.features.expiry import Expiry
from streamwork._worker.features.joins import Joins
from streamwork._worker.features.limits import Limits
from streamwork._worker.features.middleware import Middlewares
from streamwork._worker.features.ordered import OrderedGate
from streamwork._worker.features.partitions import Partitions
from streamwork._worker.features.pause import Pausing
from streamwork._worker.features.priorities import Levels
from streamwork._worker.features.schedules import Schedules

FEATURES: Final[tuple[type[Feature], ...]] = (
    Partitions,  # a stream split into partitions is refused by a plain worker
    Pausing,  # the start gate, closed while the group is paused
    Expiry,  # a job not started by its expires is dropped
    Joins,  # a join's children report their ends; its callback reads them
    Levels,  # priority levels: more sources, read in priority_order
    OrderedGate,  # one job per order key at a time
    Limits,  # rate limit and concurrency caps per key
    Chains,  # msg.send: jobs enqueued with the completion
    ChainOutbox,  # Redis Cluster: chained jobs to other slots
    Schedules,  # periodic jobs
    Middlewares,  # the user's middleware: hooks around every handler call
)
