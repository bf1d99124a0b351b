"""Partitioned streams at the seam: the ``partitions`` and ``only_partitions`` options, and
the check, as a consumer joins its group, that the stream it reads is not one split into
partitions (those are served by partitioned workers, `_worker/partitioned.py`, whose
consumers each read one partition)."""

from __future__ import annotations

from typing import Any

from streamwork._wire.partitions import check_partitions, check_recorded, check_stream, check_subset
from streamwork._worker.core.context import Context
from streamwork._worker.core.seam import Feature, Parts


class PartitionOptions:
    """The worker options of partitioned streams."""

    partitions: int = 1
    only_partitions: tuple[int, ...] | None = None


class Partitions(Feature):
    """Refuses to read a stream whose recorded partition count is not 1."""

    options = PartitionOptions
    help = {
        "partitions": "streams the stream is split into (as the producers say; cluster "
                      "scale-out)",
        "only_partitions": "consume only these partitions (repeat; default: all)",
    }

    @classmethod
    def check(cls, cfg: Any) -> None:
        check_partitions(cfg.partitions)
        check_stream(cfg.stream, cfg.partitions)
        object.__setattr__(cfg, "only_partitions",
                           check_subset(cfg.only_partitions, cfg.partitions))

    @classmethod
    def build(cls, parts: Parts) -> Partitions:
        return cls(parts.ctx)

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def on_join(self) -> None:
        """Check that the stream is not split into partitions (and record that it is
        read as one stream)."""
        ctx = self.ctx
        check_recorded(ctx.cfg.stream, await ctx.redis.get(ctx.keys.partitions), 1, "worker")
