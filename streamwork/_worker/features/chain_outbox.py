"""The outbox drain of a worker on Redis Cluster: jobs its handlers sent (``msg.send``) to
streams in other slots wait in the stream's outbox (``{S}:outbox``, written with the
sending job's completion); this loop moves them onto their targets. The ends of join
children whose join lives in another slot wait there too (kind "join"): moved with
join.lua, which counts a child once however often its report is moved.

Each move is chain.lua on the target's slot, then XDEL of the moved entries from the
outbox. A drainer that dies between the two leaves entries that were moved already: the
target's chained mark (the last outbox entry id of this source it took) makes the next
drainer skip them, so every job reaches its target once. Every worker of the stream
drains, with no leader: two drainers at once are told apart by the same mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any, Final

import redis.exceptions

from streamwork._redis import acl, connection, scripts
from streamwork._telemetry.logs import WORKER_LOGGER, fields
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names
from streamwork._worker.core.seam import Env, Feature
from streamwork._worker.core.supervisor import Link, Supervisor, cancel
from streamwork._worker.features.chains import BODY, DUE, KIND, MAXLEN, TARGET

log = logging.getLogger(WORKER_LOGGER)

IDLE: Final = 0.1  #: s between two looks at an empty outbox (the latency of a chained job)
CHUNK: Final = 500  #: outbox entries moved per look (one chain.lua call per target)
FINAL_DRAIN: Final = 2.0  #: s a stopping worker spends moving what its last jobs sent


class Drainer:
    """Moves the outbox entries of a worker's stream (its partitions) to their targets."""

    def __init__(self, cfg: Any, url: str, consumer: str,
                 link: Link | None = None) -> None:
        self.cfg = cfg
        self.consumer = consumer
        self.link = link
        self.sources = (partition_names(cfg.stream, cfg.partitions) if cfg.partitions > 1
                        else (cfg.stream,))
        self.url = url
        self.redis: Any = connection.async_client(url)
        self.scripts = scripts.AsyncScripts(self.redis, flags=False)
        self.moved = 0  #: jobs this drainer put on their targets (not those found moved)
        self.flags_known = False

    async def run(self, until: asyncio.Event, stop: asyncio.Event) -> None:
        """Drain until ``until`` is set (the worker's consumer has finished), then once more
        for what its last completions staged (FINAL_DRAIN seconds at most); on an error no
        backoff cures, set ``stop`` (which stops the whole worker) and raise WorkerFailed."""
        sup = Supervisor(_nothing, link=self.link, stream=self.cfg.stream,
                         explain=acl.explainer(self.url, self.cfg.stream),
                         group=self.cfg.group, consumer=self.consumer)
        sup.stop_event = stop
        task = sup.loop("outbox drain", self.step)
        try:
            await until.wait()
        finally:
            sup.stopping = True
            await cancel([task])
            if sup.fatal is None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.drain_all(), FINAL_DRAIN)
            with contextlib.suppress(Exception):
                await self.redis.aclose()
        if sup.fatal is not None:
            raise sup.fatal

    async def step(self) -> bool:
        """One look at every outbox; a pause when all were empty. Returns True (Redis was
        asked)."""
        if not await self.drain_all():
            await asyncio.sleep(IDLE)
        return True

    async def drain_all(self) -> int:
        """One look at every outbox; how many entries left them."""
        if not self.flags_known:  # chain.lua refused whole under OOM where flags exist
            self.scripts.use_flags(await scripts.supports_flags(self.redis))
            self.flags_known = True
        moved = 0
        for source in self.sources:
            moved += await self.drain(source)
        return moved

    async def drain(self, source: str) -> int:
        """Move up to CHUNK entries of ``source``'s outbox; how many left the outbox."""
        outbox = StreamKeys.of_any(source).outbox
        entries = await self.redis.xrange(outbox, count=CHUNK)
        if not entries:
            return 0
        targets: dict[bytes, list[list[Any]]] = {}
        joins: dict[tuple[bytes, bytes], list[list[Any]]] = {}  # by callback stream, key
        opens: list[dict[bytes, bytes]] = []  # joins handlers sent
        done: list[bytes] = []
        for entry_id, values in entries:
            target, body = values.get(TARGET), values.get(BODY)
            kind = values.get(KIND)
            if kind == b"join" and target is not None and b"j" in values:
                joins.setdefault((target, values[b"j"]), []).append(
                    [int(values[b"i"]), values[b"s"], values[b"v"], int(values[b"l"])])
                done.append(entry_id)
                continue
            if kind == b"open" and target is not None and body is not None:
                opens.append(values)
                done.append(entry_id)
                continue
            if target is None or body is None:  # not written by streamwork: nothing to move
                log.error("an outbox entry without a target or body was deleted",
                          extra=self._fields(entry_id=entry_id.decode()))
                done.append(entry_id)
                continue
            targets.setdefault(target, []).append(
                [entry_id, body, values.get(MAXLEN, b""), values.get(DUE, b"")])
        for target, rows in targets.items():
            name = target.decode()
            try:
                added, _ = await self.scripts.run(
                    scripts.chain(StreamKeys.of_any(name), source, rows))
                self.moved += int(added)
            except redis.exceptions.ResponseError as exc:
                if not str(exc).startswith("WRONGTYPE"):
                    raise
                # what a staged write Redis rejects gets too: logged, not retried forever
                log.error("chained jobs dropped: their target is not a stream (%s)", exc,
                          extra=self._fields(key=name, count=len(rows)))
            done += [row[0] for row in rows]
        for o in opens:  # before the reports: a report of an open join may fire it
            await self._join(o[b"j"], scripts.join_open(
                StreamKeys.of_any(o[TARGET].decode()), o[b"j"].decode(), int(o[b"n"]),
                o[b"p"].decode(), o[b"o"].decode(), o[BODY], int(o[b"l"])))
        for (target, key), reports in joins.items():  # a join child's end (joins feature)
            await self._join(key, scripts.join_report(
                StreamKeys.of_any(target.decode()), key.decode(),
                [r[:3] for r in reports], max(r[3] for r in reports)))
        await self.redis.xdel(outbox, *done)
        return len(done)

    async def _join(self, key: bytes, call: scripts.Call) -> None:
        """join.lua for outbox entries; an error reply Redis gives for good (the key names
        another join, a key of another type) is logged and the entries dropped, as a
        staged write Redis rejects is: retrying could not help, and it must not stop the
        drain (and the worker) for every other entry."""
        try:
            await self.scripts.run(call)
        except redis.exceptions.ResponseError as exc:
            if not str(exc).startswith(("JOINKEY", "WRONGTYPE")):
                raise
            log.error("join outbox entries dropped: %s", exc,
                      extra=self._fields(key=key.decode(errors="replace")))

    def _fields(self, **more: Any) -> dict[str, Any]:
        return fields(stream=self.cfg.stream, group=self.cfg.group, consumer=self.consumer,
                      **more)


async def _nothing() -> None:
    """A vanished group is the consumer's business; the drain has nothing to recreate."""


async def with_drain(main: Awaitable[None], cfg: Any, url: str, consumer: str,
                     stop: asyncio.Event, link: Link | None = None) -> None:
    """Await ``main`` (the worker's consumer) with a `Drainer` beside it when ``url`` is a
    Redis Cluster's (elsewhere chained jobs need no outbox): either one failing stops both
    (through ``stop``), and the drainer's error is raised when the consumer had none."""
    if not connection.is_cluster_url(url):
        await main
        return
    until = asyncio.Event()
    task = asyncio.ensure_future(Drainer(cfg, url, consumer, link).run(until, stop))
    try:
        await main
    except BaseException:
        until.set()
        await asyncio.gather(task, return_exceptions=True)
        raise
    until.set()
    await task


async def serve_outbox(main: Awaitable[None], env: Env) -> None:
    """The worker-wide service of chains: `with_drain` beside the worker's consumers."""
    await with_drain(main, env.cfg, env.url, env.consumer, env.stop, env.link)


class ChainOutbox(Feature):
    """The outbox of chained jobs on Redis Cluster: a worker-wide service, nothing per
    consumer."""

    service = staticmethod(serve_outbox)
