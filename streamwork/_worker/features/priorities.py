"""Priority levels on the worker's side: which level streams exist, reading them in
``priority_order``, and where a read entry came from.

A worker reads the stream itself and its group's retry stream with one XREADGROUP, as
always, until a job was sent at another level than normal: a look every
`DISCOVER_EVERY` seconds (one EXISTS of the two level streams, never one per batch) finds
the level's stream, joins the group to it and from then on each read round is one
read.lua call over all the levels (``strict``: higher levels drained first; ``weighted``:
shares by ``priority_weights``), followed by a blocking XREADGROUP only when that round
found nothing. read.lua also joins a level whose stream appears later, in the same call.
Ordered mode reads no level (refused by the options; jobs sent there are logged).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final, cast

import redis.exceptions

from streamwork._redis import scripts
from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._wire.keys import StreamKeys
from streamwork._wire.priorities import (
    DEFAULT_WEIGHTS,
    check_order,
    parse_weights,
    sibling_streams,
)
from streamwork._worker.core.delivery import MAIN, RETRY, Entry
from streamwork._worker.core.options import CoreConfig
from streamwork._worker.core.seam import Feature, Parts, Step
from streamwork._worker.core.sources import Sources

log = logging.getLogger(WORKER_LOGGER)

DISCOVER_EVERY: Final = 1.0  #: s between looks for a level stream not joined yet
HIGH, LOW = 2, 3  #: the sources of the high and low levels (sources.py)
#: where each level's entries come from, highest first (normal: the stream itself)
_SRC: Final = {"high": HIGH, "normal": MAIN, "low": LOW}


class PriorityOptions:
    """The worker options of priority levels."""

    priority_order: str = "strict"
    priority_weights: str = DEFAULT_WEIGHTS


class _Config(CoreConfig, PriorityOptions):
    """The options `Levels` reads (and ``ordered``, which reads no level)."""

    ordered: bool


class Levels(Feature):
    """The levels one consumer reads: the consumer's sources (sources.py) get the high and
    low level streams (sources 2 and 3, ranked before and after the stream itself); with
    none joined, reading is the consumer's own single-stream XREADGROUP."""

    options = PriorityOptions
    help = {
        "priority_order": "how reads are shared among the high, normal and low levels: "
                          "strict (higher levels drained first) or weighted "
                          "(priority_weights)",
        "priority_weights": "weighted order: reads of high:normal:low per round (e.g. 8:2:1; "
                            "every level with jobs gets at least one)",
    }

    @classmethod
    def check(cls, cfg: Any) -> None:
        check_order(cfg.priority_order)
        parse_weights(cfg.priority_weights)

    @classmethod
    def build(cls, parts: Parts) -> Levels:
        ctx = parts.ctx
        return cls(cast(_Config, ctx.cfg), ctx.sources, ctx.name, ctx.scripts.run, ctx.redis)

    def __init__(self, cfg: _Config, sources: Sources, consumer: str, run: Any,
                 client: Any = None) -> None:
        self.cfg, self.consumer, self._run, self._client = cfg, consumer, run, client
        self.sources = sources
        high, low = sibling_streams(StreamKeys.of_any(cfg.stream))
        sources.add(HIGH, high, -1)  # high is read (and reclaimed) before the stream
        sources.add(LOW, low, 2)  # low after the retry stream
        weights = parse_weights(cfg.priority_weights)
        # the streams a read round serves, highest first: retries and replays (of every
        # level: the group's retry stream holds them all) come right after the high level,
        # so they never hold up a high job and are not held up by normal and low work;
        # weighted, they get the normal level's share
        self._order = [sources.names[HIGH], sources.names[RETRY], sources.names[MAIN],
                       sources.names[LOW]]
        self._weights = [weights["high"], weights["normal"], weights["normal"],
                         weights["low"]]
        self._owed = [0.0] * len(self._order)  # weighted: what each is owed (deficits)
        self._strict = cfg.priority_order == "strict"
        self._warned = False

    @property
    def active(self) -> bool:
        """Whether reads go over the levels (some level stream has the group)."""
        return self.sources.extra

    def loops(self) -> list[tuple[str, Step]]:
        return [("levels", lambda: self.discover_step(self._client))]

    async def on_join(self) -> None:
        """The group was joined (again): look for the level streams jobs were sent to."""
        await self.discover(self._client)

    async def discover(self, client: Any) -> bool:
        """Join the group to level streams that exist (created at id 0: all their jobs).
        One EXISTS when none is new; returns whether Redis was asked."""
        sources = self.sources
        missing = [src for src in (HIGH, LOW) if src not in sources.joined]
        if not missing or not await client.exists(*(sources.names[s] for s in missing)):
            return bool(missing)
        for src in missing:
            if not await client.exists(sources.names[src]):
                continue
            if self.cfg.ordered:
                if not self._warned:
                    self._warned = True
                    log.error("jobs were sent to %s at another priority than normal; an "
                              "ordered worker does not read them: send them without "
                              "priority=", sources.names[src])
                continue
            try:
                await client.xgroup_create(sources.names[src], self.cfg.group, id="0")
            except redis.exceptions.ResponseError as exc:
                if not str(exc).startswith("BUSYGROUP"):
                    raise
            sources.join(src)
        return True

    async def discover_step(self, client: Any) -> bool:
        """The worker's "levels" loop: look for new levels now and then."""
        await asyncio.sleep(DISCOVER_EVERY)
        if {HIGH, LOW} <= self.sources.joined or self._warned:
            return False
        return await self.discover(client)

    def shares(self, room: int) -> tuple[list[int], list[int]]:
        """This round's order of the streams (indexes into their serving order) and each
        one's count. Strict: the serving order, the room for each in turn. Weighted: a
        deficit round robin: each stream is owed its weight's share of the room, takes
        the whole entries it is owed (and, for the room rounding leaves, those owed most),
        and what a stream leaves unused goes to the others in the order of what they are
        owed; so even a read of one entry goes to each level in turn by weight."""
        n = len(self._order)
        if self._strict:
            return list(range(n)), [room] * n
        owed, weights = self._owed, self._weights
        total = sum(weights)
        for i in range(n):
            owed[i] += weights[i] * room / total
        counts = [max(0, int(o)) for o in owed]
        by_owed = sorted(range(n), key=lambda i: owed[i] - counts[i], reverse=True)
        for i in by_owed[:max(0, room - sum(counts))]:
            counts[i] += 1
        return sorted(range(n), key=lambda i: owed[i], reverse=True), counts

    def settle(self, counts: list[int], taken: list[int]) -> None:
        """A weighted round took ``taken`` of each stream (given ``counts``): what each is
        owed drops by what it took; one that had fewer new entries than its count owes and
        is owed nothing (an idle level saves up no share for later)."""
        owed = self._owed
        for i, (count, took) in enumerate(zip(counts, taken, strict=True)):
            owed[i] = 0.0 if took < count else owed[i] - took

    async def read(self, count: int) -> list[tuple[bytes, list[Entry]]] | None:
        """One read round over the levels, once one is joined (else None: the consumer's
        own read): read.lua (no wait), then, if it found nothing, a blocking XREADGROUP of
        every existing stream. Returns [(stream, entries), ...]."""
        if not self.sources.extra:
            return None
        cfg, client = self.cfg, self._client
        order, counts = self.shares(count)
        flat = await self._run(scripts.read([self._order[i] for i in order], cfg.group,
                                            self.consumer, count, cfg.priority_order,
                                            [counts[i] for i in order]))
        pairs = list(zip(flat[::2], flat[1::2], strict=True))
        if not self._strict:
            taken = {stream: len(entries) for stream, entries in pairs}
            self.settle(counts, [taken.get(s.encode(), 0) for s in self._order])
        for stream, _ in pairs:
            if (src := self.sources.src_of(stream)) >= HIGH:
                self.sources.join(src)
        if any(entries for _, entries in pairs):
            return pairs
        names = [stream for stream, _ in pairs] or [cfg.stream, self.sources.names[RETRY]]
        reply = await client.execute_command(
            "XREADGROUP", "GROUP", cfg.group, self.consumer, "COUNT",
            max(1, count // len(names)), "BLOCK", max(1, round(cfg.read_block * 1000)),
            "STREAMS", *names, *([">"] * len(names)))
        return list(reply.items() if isinstance(reply, dict) else reply or ())
