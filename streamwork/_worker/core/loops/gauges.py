"""The stream gauges of a worker: lag, pending, delayed and dead for OpenTelemetry, read
every few seconds. Lag and pending of a group include its retry stream and its due retries,
as ``streamwork inspect`` counts them (:mod:`streamwork._ops.stats`)."""

from __future__ import annotations

import asyncio
from typing import Any, Final

import redis.exceptions

from streamwork._ops.sides import RetrySide, level_side, retry_side
from streamwork._redis.faults import denial
from streamwork._telemetry import api as telemetry
from streamwork._wire.keys import StreamKeys
from streamwork._worker.core.context import Context
from streamwork._worker.core.loops.reclaim import jitter
from streamwork.errors import ConfigError

GAUGE_INTERVAL: Final = 5.0  #: s between reads of lag/pending/delayed/dead for the gauges


async def gauges_step(ctx: Context) -> bool:
    """Refresh the stream gauges (lag, pending, delayed, dead), then wait a few seconds.
    Returns whether Redis answered: gauges are best effort, so an error is swallowed here,
    and a step that swallowed one (or did not ask) must not count as Redis answering. A
    permission the user lacks is not swallowed: the worker stops saying what to grant,
    rather than run on with gauges that never show."""
    reached = False
    ctx.tally.refresh()  # an OpenTelemetry SDK may have been installed meanwhile
    if ctx.tally.metering:
        try:
            await read_gauges(ctx)
            reached = True
        except (redis.exceptions.RedisError, OSError) as exc:
            if denial(exc) is not None:
                raise
    await asyncio.sleep(jitter(GAUGE_INTERVAL))
    return reached


async def _retry_sides(client: Any, keys: StreamKeys, names: list[str],
                       now_ms: int) -> dict[str, RetrySide]:
    """Each group's retry stream and retry ZSET figures, in one pipelined round trip (four
    commands per group); a group whose name streamwork would not accept has none."""
    pipe = client.pipeline(transaction=False)
    asked: list[str] = []
    for name in names:
        try:
            gkeys = keys.group(name)
        except ConfigError:
            continue
        pipe.xinfo_groups(gkeys.retry)
        pipe.xlen(gkeys.retry)
        pipe.zcard(gkeys.retries)
        pipe.zcount(gkeys.retries, "-inf", now_ms)
        asked.append(name)
    if not asked:
        return {}
    replies = await pipe.execute(raise_on_error=False)
    sides: dict[str, RetrySide] = {}
    for i, name in enumerate(asked):
        groups, length, waiting, due = replies[4 * i: 4 * i + 4]
        if not isinstance(waiting, Exception) and not isinstance(due, Exception):
            sides[name] = retry_side(name, groups, length, waiting, due)
    return sides


async def read_gauges(ctx: Context) -> None:
    """Two pipelined reads (plus the server's clock) of the figures behind the gauges."""
    pipe = ctx.redis.pipeline(transaction=False)
    pipe.xinfo_groups(ctx.cfg.stream)
    pipe.zcard(ctx.keys.delayed)
    pipe.xlen(ctx.keys.dead)
    for stream in ctx.sources.added():  # the sources features added: lag and pending
        pipe.xinfo_groups(stream)
        pipe.xlen(stream)
    groups, delayed, dead, *added = await pipe.execute(raise_on_error=False)
    if isinstance(groups, Exception):
        return
    secs, micros = await ctx.redis.time()
    named = [(g["name"].decode() if isinstance(g["name"], bytes) else str(g["name"]), g)
             for g in groups]
    sides = await _retry_sides(ctx.redis, ctx.keys, [name for name, _ in named],
                               int(secs) * 1000 + int(micros) // 1000)
    # delayed, as inspect counts it: delayed sends and every group's retries waiting
    waiting = int(delayed) + sum(side.waiting for side in sides.values())
    oldest: list[tuple[str, Any]] = []
    for name, g in named:
        side = sides.get(name)
        # without its retry figures (a read error) the lag is not known: report none
        lag = None if side is None else side.total_lag(g.get("lag"))
        lags, added_pending = level_side(name, added)
        if lag is not None:
            lag = None if None in lags.values() else lag + sum(v or 0 for v in lags.values())
        pending = int(g["pending"]) + added_pending + (0 if side is None else side.pending)
        telemetry.set_gauges(ctx.cfg.stream, name, lag, pending, waiting, int(dead))
        if int(g["pending"]):
            oldest.append((name, g))
        else:
            telemetry.set_oldest_pending_idle(ctx.cfg.stream, name, 0.0)
    if oldest:  # the idle time of each group's oldest pending delivery
        pipe = ctx.redis.pipeline(transaction=False)
        for name, _ in oldest:
            pipe.xpending_range(ctx.cfg.stream, name, min="-", max="+", count=1)
        for (name, _), rows in zip(oldest, await pipe.execute(raise_on_error=False),
                                   strict=True):
            if isinstance(rows, list):
                idle_ms = int(rows[0]["time_since_delivered"]) if rows else 0
                telemetry.set_oldest_pending_idle(ctx.cfg.stream, name, idle_ms / 1000)
