"""The consumer group a worker joins, made ready before it reads: created at id 0 (so
earlier jobs are delivered) on the stream and on the group's retry stream if missing."""

from __future__ import annotations

import redis.exceptions

from streamwork._worker.core.context import Context


async def ensure_group(ctx: Context) -> None:
    """Create ``ctx``'s group where it is missing, recording whether the group keeps job
    records (what a cancel can do depends on it: without, nothing)."""
    cfg, client = ctx.cfg, ctx.redis
    await client.hset(ctx.gkeys.settings, "dedup", "1" if cfg.dedup else "0")
    for stream in (cfg.stream, ctx.gkeys.retry):
        await create_group(client, stream, cfg.group)
    ctx.sources.forget()  # a feature's sources are looked for (again) as it joins


async def create_group(client: object, stream: str, group: str) -> None:
    """``XGROUP CREATE stream group 0 MKSTREAM``, a group already there being fine."""
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)  # type: ignore[attr-defined]
    except redis.exceptions.ResponseError as exc:
        if not str(exc).startswith("BUSYGROUP"):
            raise
