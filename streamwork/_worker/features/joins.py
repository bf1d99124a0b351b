"""Joins (fan-in), the worker's part: a delivery whose job is a join's child reports its
end (done with its result, dead, cancelled, ended) in the script that records that end
(`core.ends`: join_lib.lua), so the join's callback is enqueued exactly once, by the
completion of the last child; a callback's handler reads how every child ended
(``msg.join_results``), fetched while its lease is taken.

On one Redis, or with the join in the child's own Cluster slot, the report is written into
the join directly. On Redis Cluster with the join in another slot it is written into the
child stream's outbox, from where the outbox drain (`chain_outbox`) moves it with
join.lua: a report moved twice counts once (one per child index)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from redis.crc import key_slot

from streamwork._redis import scripts
from streamwork._wire.extensions import Codec
from streamwork._wire.joins import JoinChild, decode_results, done_value
from streamwork._wire.keys import StreamKeys
from streamwork._worker.core.delivery import Delivery
from streamwork._worker.core.seam import Feature, Parts
from streamwork._worker.features.chains import is_cluster


class ChildReport:
    """A join child's end report (`core.ends.EndReport`)."""

    __slots__ = ("_names", "_via", "index", "job_key", "keys", "max_bytes", "ttl_ms")

    def __init__(self, own: StreamKeys, join: tuple[str, str, int, int], job_key: str,
                 cluster: bool, max_bytes: int) -> None:
        stream, key, self.index, self.ttl_ms = join
        self.job_key, self.max_bytes = job_key, max_bytes
        target = StreamKeys.of_any(stream)
        names = (target.join(key), target.join_results(key), target.dead)
        other = cluster and key_slot(names[0].encode()) != key_slot(own.stream.encode())
        self._via: tuple[str, str] | None = (stream, key) if other else None
        self.keys: tuple[str, ...] = (own.outbox,) if other else names
        self._names = names

    def spec(self, first_key: int, done: bytes) -> bytes:
        if self._via is None:
            body: list[Any] = [1, first_key, first_key + 1, first_key + 2, self.index,
                               self.ttl_ms]
        else:
            body = [2, first_key, self._via[0], self._via[1], self.index, self.ttl_ms]
        return scripts.pack([*body, self.job_key, done])

    def done_value(self, result: Any, pack: Any) -> bytes:
        value = done_value(self.job_key, result, pack)
        if len(value) > self.max_bytes:  # too large to keep, as a done record's result
            value = done_value(self.job_key, None, pack)
        return value


class Results:
    """A callback's view of its join's results, fetched once (``msg.join_results``)."""

    __slots__ = ("_codec", "_fetch", "_loop", "_task")

    def __init__(self, redis: Any, stream: str, key: str, codec: Codec | None) -> None:
        self._codec = codec
        self._loop = asyncio.get_running_loop()
        name = StreamKeys.of_any(stream).join_results(key)
        self._task: asyncio.Task[Any] = self._loop.create_task(redis.hgetall(name))
        # a failed read surfaces in the handler that asks; one that never asks is fine
        self._task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def get(self) -> tuple[JoinChild, ...]:
        """The children's outcomes, by index."""
        return decode_results(await asyncio.shield(self._task), self._codec)

    def get_sync(self) -> tuple[JoinChild, ...]:
        """`get` from a plain def handler's thread."""
        if self._task.done():
            return decode_results(self._task.result(), self._codec)
        future = asyncio.run_coroutine_threadsafe(self.get(), self._loop)
        return future.result()


class Joins(Feature):
    """Hangs end reports on join children and result readers on callbacks."""

    def __init__(self, parts: Parts) -> None:
        self.ctx = parts.ctx
        self.codec = parts.codec
        self.cluster = is_cluster(parts.ctx.redis)

    @classmethod
    def build(cls, parts: Parts) -> Joins:
        return cls(parts)

    def end_report(self, options: Mapping[str, Any], job_key: str) -> ChildReport | None:
        join = options.get("join")
        if join is None:
            return None
        return ChildReport(self.ctx.keys, join, job_key, self.cluster,
                           self.ctx.cfg.max_result_bytes)

    def on_admit(self, fresh: list[Delivery]) -> None:
        for d in fresh:
            options = d.msg.options
            if not options:  # most jobs carry no option at all
                continue
            of = options.get("join_of")
            if of is not None and d.msg._join is None:
                d.msg._join = Results(self.ctx.redis, d.msg.stream, of, self.codec)
