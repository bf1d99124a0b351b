"""The consumer group a worker joins, made ready before it reads: created at id 0 (so
earlier jobs are delivered) on the stream and on the group's retry stream if missing."""

from __future__ import annotations

import redis.exceptions

from streamwork._wire.partitions import check_recorded
from streamwork._worker.core.context import Context


async def ensure_group(ctx: Context) -> None:
    """Create ``ctx``'s group where it is missing, after checking the stream is not split
    into partitions (those are served by partitioned workers only) and recording whether
    the group keeps job records (what a cancel can do depends on it: without, nothing)."""
    cfg, client = ctx.cfg, ctx.redis
    check_recorded(cfg.stream, await client.get(ctx.keys.partitions), 1, "worker")
    await client.hset(ctx.gkeys.settings, "dedup", "1" if cfg.dedup else "0")
    for stream in (cfg.stream, ctx.gkeys.retry):
        try:
            await client.xgroup_create(stream, cfg.group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if not str(exc).startswith("BUSYGROUP"):
                raise
    ctx.levels.forget()  # the priority levels jobs were sent at, looked for (again)
    await ctx.levels.discover(client)
