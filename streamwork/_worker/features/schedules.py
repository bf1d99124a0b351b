"""The scheduler loop of a worker with ``schedules``: enqueue each due tick once, across all
workers, and publish the schedules for ``streamwork schedules``.

Every live worker runs this loop beside its consumer; there is no leader. When a tick falls
due, each worker calls tick.lua with it: the script enqueues the tick only if the
schedule's last-tick key (``{S}:tick:<len(G)>:G:<name>``) says it is not decided yet, and
moves that key in the same step, so a tick is enqueued once however many workers try and
whichever of them dies when. The job record of the tick's key (``<name>:<tick time>``,
dedup on) makes it run once as well.

Ticks go onto the group's own stream (its retry stream, read in the same XREADGROUP as the
main stream): a schedule belongs to a worker class, so only its group runs the ticks, even
when other groups read the same stream. On a partitioned stream the schedule's name picks
the partition (its order key), and the last-tick key lives in that partition's slot.

"Now" is the Redis server's clock (the offset to it is measured on every call), so workers
on machines whose clocks disagree still agree on which ticks are due; tick.lua refuses a
tick that is not due on the server's clock yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from streamwork._redis import acl, connection, scripts
from streamwork._telemetry.logs import WORKER_LOGGER, fields
from streamwork._wire.codec import pack_body
from streamwork._wire.extensions import Codec
from streamwork._wire.job_options import wire_map
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import check_recorded, partition_names, partition_of
from streamwork._wire.payloads import to_plain
from streamwork._wire.schedules import MAX_CATCH_UP, Schedule, check_catch_up, plan, tick_key
from streamwork._worker.core.seam import Env, Feature
from streamwork._worker.core.supervisor import Link, Supervisor, cancel

__all__ = ["SCHEDULE_HEADER", "TICK_HEADER", "Scheduler", "Schedules", "with_schedules"]

log = logging.getLogger(WORKER_LOGGER)

SCHEDULE_HEADER: Final = "sw-schedule"  #: header naming the schedule a tick job came from
TICK_HEADER: Final = "sw-tick"  #: header with the tick's time, Unix ms as a decimal string
MAX_SLEEP: Final = 1.0  #: s, longest pause between two looks (clock changes are seen soon)
MIN_SLEEP: Final = 0.005  #: s, shortest pause (a tick the server found early is retried)
PUBLISH_EVERY: Final = 30.0  #: s between two publications of the schedules (jittered)
PUBLISHED_TTL_MS: Final = 7 * 86_400_000  #: the schedules hash lives this long unrefreshed
#: the most ticks (and body bytes) one tick.lua call carries; a longer catch-up is chunked
CHUNK_TICKS: Final = 100
CHUNK_BYTES: Final = 4 * 1024 * 1024


@dataclass
class _State:
    """One schedule as this worker follows it."""

    schedule: Schedule
    stream: str  # where its jobs go: the group's retry stream (of its partition)
    tick_key: str  # its last-tick key
    cursor: int | None = None  # ticks up to here are decided (None: not read yet)


class Scheduler:
    """Enqueues the ticks of a worker's schedules until stopped."""

    def __init__(self, schedules: Sequence[Schedule], cfg: Any, url: str,
                 consumer: str, link: Link | None = None, codec: Codec | None = None) -> None:
        self.cfg = cfg
        self.codec = codec  # the worker's: its own types in schedule payloads
        self.link = link  # the worker's: an outage is reported once, not per client
        self.consumer = consumer
        self.url = url
        self.redis: Any = connection.async_client(url)
        self.scripts = scripts.AsyncScripts(self.redis, flags=False)
        self.base = StreamKeys.for_stream(cfg.stream).group(cfg.group)
        names = partition_names(cfg.stream, cfg.partitions)
        self.states = [self._state(s, names) for s in schedules]
        self.offset_ms = 0.0  # the Redis server's clock minus ours
        self.started = False
        self.published_at = -PUBLISH_EVERY
        self.counts = {"ticks_enqueued": 0, "ticks_skipped": 0}

    def _state(self, schedule: Schedule, names: Sequence[str]) -> _State:
        stream = names[partition_of(schedule.name, len(names))]
        g = StreamKeys.for_stream(stream).group(self.cfg.group)
        return _State(schedule, g.retry, g.tick(schedule.name))

    def now_ms(self) -> int:
        """The Redis server's clock, as estimated here (Unix ms)."""
        return int(time.time() * 1000 + self.offset_ms)

    def _saw_server(self, server_ms: int) -> None:
        self.offset_ms = server_ms - time.time() * 1000

    # ---- running ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Enqueue due ticks until ``stop`` is set; raise WorkerFailed (after setting
        ``stop``, which stops the whole worker) on an error no backoff cures."""
        sup = Supervisor(_nothing, link=self.link, stream=self.cfg.stream, group=self.cfg.group,
                         explain=acl.explainer(self.url, self.cfg.stream),
                         consumer=self.consumer)
        sup.stop_event = stop
        task = sup.loop("scheduler", self.step)
        try:
            await stop.wait()
        finally:
            sup.stopping = True
            await cancel([task])
            with contextlib.suppress(Exception):
                await self.redis.aclose()
        if sup.fatal is not None:
            raise sup.fatal

    async def step(self) -> bool:
        """One look: start if not started, enqueue what is due, publish now and then, then
        sleep until the next tick (at most MAX_SLEEP). Returns whether Redis was asked."""
        reached = False
        if not self.started:
            await self.start()
            reached = True
        now = self.now_ms()
        for st in self.states:
            if st.cursor is not None and st.cursor < now:
                reached = await self.enqueue_due(st, now) or reached
        if time.monotonic() - self.published_at >= PUBLISH_EVERY:
            await self.publish()
            reached = True
        now = self.now_ms()
        # the first tick not decided yet (one refused as early is tried again soon)
        upcoming = [st.schedule.next_after(st.cursor if st.cursor is not None else now)
                    for st in self.states]
        wait_ms = min([t - now for t in upcoming if t is not None], default=MAX_SLEEP * 1000)
        await asyncio.sleep(min(max(wait_ms / 1000, MIN_SLEEP), MAX_SLEEP))
        return reached

    async def start(self) -> None:
        """Find where each schedule stands (its last-tick key) and the server's clock;
        refuse to go on if the stream's recorded partition count is another one."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(self.base.stream.partitions)
        for st in self.states:
            pipe.get(st.tick_key)
        recorded, *lasts = await pipe.execute()
        check_recorded(self.cfg.stream, recorded, self.cfg.partitions, "worker")
        before = time.time() * 1000
        seconds, micros = await self.redis.time()
        self.offset_ms = seconds * 1000 + micros / 1000 - (before + time.time() * 1000) / 2
        now = self.now_ms()
        for st, last in zip(self.states, lasts, strict=True):
            # never ticked: start from now (a first tick is not a missed one)
            st.cursor = int(last) if last is not None else now
        self.started = True
        log.info("schedules started: %s", ", ".join(st.schedule.name for st in self.states),
                 extra=fields(stream=self.cfg.stream, group=self.cfg.group,
                              consumer=self.consumer, outcome=f"catch_up={self.cfg.catch_up}"))

    async def enqueue_due(self, st: _State, now: int) -> bool:
        """Decide the ticks of ``st`` due by ``now`` that nobody decided yet: enqueue those
        on time and, of the missed ones, what ``catch_up`` says. Returns whether Redis was
        asked (not when no tick is due)."""
        assert st.cursor is not None
        ticks, older = st.schedule.ticks(st.cursor, now, MAX_CATCH_UP)
        if not ticks:
            return False
        chosen = plan(ticks, now, self.cfg.catch_up)
        skipped = len(ticks) - len(chosen)
        if older or skipped:
            log.warning(
                "schedule %s missed ticks (no worker enqueued them in time): %s%d skipped, %d "
                "enqueued (catch_up=%s)", st.schedule.name, "more than " if older else "",
                skipped, len(chosen), self.cfg.catch_up,
                extra=fields(stream=self.cfg.stream, group=self.cfg.group,
                             key=st.schedule.name))
        enqueued = 0
        for upto, chunk in self._chunks(st, chosen, ticks[-1]):
            done, last, server_now = await self.scripts.run(
                scripts.tick(st.stream, st.tick_key, upto, chunk))
            self._saw_server(int(server_now))
            if int(last) < upto:  # not due yet on the server's clock: look again soon
                return True
            enqueued += int(done)
            st.cursor = max(st.cursor, int(last))
        self.counts["ticks_enqueued"] += enqueued
        self.counts["ticks_skipped"] += skipped
        if enqueued:
            log.debug("schedule %s: %d tick(s) enqueued", st.schedule.name, enqueued,
                      extra=fields(stream=self.cfg.stream, group=self.cfg.group,
                                   key=st.schedule.name, count=enqueued))
        return True

    def _chunks(self, st: _State, chosen: list[int],
                upto: int) -> list[tuple[int, list[tuple[int, bytes]]]]:
        """tick.lua calls for ``chosen``: each with its ticks' bodies and the tick it
        decides up to (the last call: ``upto``, the latest tick looked at)."""
        s = st.schedule
        payload = to_plain(s.payload, self.codec)
        sent = int(time.time() * 1000)
        calls: list[tuple[int, list[tuple[int, bytes]]]] = []
        chunk: list[tuple[int, bytes]] = []
        size = 0
        for tick in chosen:
            headers = {SCHEDULE_HEADER: s.name, TICK_HEADER: str(tick)}
            body = pack_body(tick_key(s.name, tick), payload, headers, sent,
                             self.cfg.max_payload_bytes, wire_map({"order_key": s.name}),
                             self.codec)
            if chunk and (len(chunk) >= CHUNK_TICKS or size + len(body) > CHUNK_BYTES):
                calls.append((chunk[-1][0], chunk))
                chunk, size = [], 0
            chunk.append((tick, body))
            size += len(body)
        calls.append((upto, chunk))
        return calls

    async def publish(self) -> None:
        """Write each schedule (spec, its last-tick key, next run) to the group's schedules
        hash, for ``streamwork schedules``; the hash expires when nobody refreshes it."""
        now = self.now_ms()
        entries = {}
        for st in self.states:
            s = st.schedule
            entries[s.name] = json.dumps({
                **s.describe(), "catch_up": self.cfg.catch_up, "stream": st.stream,
                "tick_key": st.tick_key, "next_ms": s.next_after(max(st.cursor or now, now)),
                "updated_ms": now, "consumer": self.consumer}, separators=(",", ":"))
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.base.schedules, mapping=entries)
        pipe.pexpire(self.base.schedules, PUBLISHED_TTL_MS)
        await pipe.execute()
        self.published_at = time.monotonic() + random.uniform(-3.0, 0.0)


async def _nothing() -> None:
    """A vanished group is the consumer's business; the scheduler has nothing to recreate."""


async def with_schedules(main: Awaitable[None], schedules: Sequence[Schedule],
                         cfg: Any, url: str, consumer: str,
                         stop: asyncio.Event, link: Link | None = None,
                         codec: Codec | None = None) -> None:
    """Await ``main`` (the worker's consumer) with a `Scheduler` beside it when there are
    ``schedules``: either one failing stops both (through ``stop``), and the scheduler's
    error is raised when the consumer had none."""
    if not schedules:
        await main
        return
    task = asyncio.ensure_future(Scheduler(schedules, cfg, url, consumer, link,
                                           codec).run(stop))
    try:
        await main
    except BaseException:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        raise
    stop.set()
    await task



class ScheduleOptions:
    """The worker option of periodic jobs (the schedules themselves are the Python-only
    ``schedules`` attribute)."""

    catch_up: str = "last"


async def serve_schedules(main: Awaitable[None], env: Env) -> None:
    """The worker-wide service: `with_schedules` for the worker's ``schedules``."""
    await with_schedules(main, env.extras.get("schedules", ()), env.cfg, env.url,
                         env.consumer, env.stop, env.link, env.codec)


class Schedules(Feature):
    """Periodic jobs: a worker-wide service (`serve_schedules`), nothing per consumer."""

    options = ScheduleOptions
    help = {"catch_up": "ticks of the schedules missed while no worker ran: last (run the "
                        "latest), all, or none"}
    service = staticmethod(serve_schedules)

    @classmethod
    def check(cls, cfg: Any) -> None:
        check_catch_up(cfg.catch_up)
