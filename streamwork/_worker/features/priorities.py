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
from typing import Any, Final

import redis.exceptions

from streamwork._redis import scripts
from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._wire.keys import StreamKeys
from streamwork._wire.priorities import LEVELS, parse_weights, sibling_streams
from streamwork._worker.config import WorkerConfig
from streamwork._worker.core.delivery import HIGH, LOW, MAIN, RETRY

log = logging.getLogger(WORKER_LOGGER)

DISCOVER_EVERY: Final = 1.0  #: s between looks for a level stream not joined yet
#: where each level's entries come from, highest first (normal: the stream itself)
_SRC: Final = {"high": HIGH, "normal": MAIN, "low": LOW}


class Levels:
    """The levels one consumer reads: ``joined`` holds the sources (HIGH, LOW) whose
    stream has the group; with none joined, reading is the single-stream XREADGROUP."""

    def __init__(self, cfg: WorkerConfig, retry: str, consumer: str, run: Any) -> None:
        self.cfg, self.consumer, self._run = cfg, consumer, run
        high, low = sibling_streams(StreamKeys.of_any(cfg.stream))
        self.streams: dict[int, str] = {MAIN: cfg.stream, RETRY: retry, HIGH: high, LOW: low}
        self._src = {name.encode(): src for src, name in self.streams.items()}
        self.joined: set[int] = set()
        weights = parse_weights(cfg.priority_weights)
        # read.lua's streams in the order they are served, each with its weight (retry: 0,
        # served first: retries and replays were read once already)
        self._order = [retry, *(self.streams[_SRC[level]] for level in LEVELS)]
        self._weights = [0, *(weights[level] for level in LEVELS)]
        self._warned = False

    @property
    def active(self) -> bool:
        """Whether reads go over the levels (some level stream has the group)."""
        return bool(self.joined)

    def src_of(self, stream: bytes) -> int:
        """The source (MAIN, RETRY, HIGH, LOW) of entries read from ``stream``."""
        return self._src.get(stream, RETRY)

    def sources(self) -> list[tuple[int, str]]:
        """The streams with this group, highest level first (so the reclaimer takes back
        high jobs first): a joined high level, the stream, the retry stream, low."""
        return [(src, self.streams[src]) for src in (HIGH, MAIN, RETRY, LOW)
                if src < HIGH or src in self.joined]

    def forget(self) -> None:
        """The group was recreated (Redis came back empty): look for the levels again."""
        self.joined.clear()

    async def discover(self, client: Any) -> bool:
        """Join the group to level streams that exist (created at id 0: all their jobs).
        One EXISTS when none is new; returns whether Redis was asked."""
        missing = [src for src in (HIGH, LOW) if src not in self.joined]
        if not missing or not await client.exists(*(self.streams[s] for s in missing)):
            return bool(missing)
        for src in missing:
            if not await client.exists(self.streams[src]):
                continue
            if self.cfg.ordered:
                if not self._warned:
                    self._warned = True
                    log.error("jobs were sent to %s at another priority than normal; an "
                              "ordered worker does not read them: send them without "
                              "priority=", self.streams[src])
                continue
            try:
                await client.xgroup_create(self.streams[src], self.cfg.group, id="0")
            except redis.exceptions.ResponseError as exc:
                if not str(exc).startswith("BUSYGROUP"):
                    raise
            self.joined.add(src)
        return True

    async def discover_step(self, client: Any) -> bool:
        """The worker's "levels" loop: look for new levels now and then."""
        await asyncio.sleep(DISCOVER_EVERY)
        if len(self.joined) == 2 or self._warned:
            return False
        return await self.discover(client)

    async def read(self, client: Any, count: int) -> list[Any]:
        """One read round over the levels: read.lua (no wait), then, if it found nothing, a
        blocking XREADGROUP of every existing stream. Returns [(stream, entries), ...]."""
        cfg = self.cfg
        flat = await self._run(scripts.read(self._order, cfg.group, self.consumer, count,
                                            cfg.priority_order, self._weights))
        pairs = list(zip(flat[::2], flat[1::2], strict=True))
        for stream, _ in pairs:
            if (src := self.src_of(stream)) >= HIGH:
                self.joined.add(src)
        if any(entries for _, entries in pairs):
            return pairs
        names = [stream for stream, _ in pairs] or [cfg.stream, self.streams[RETRY]]
        reply = await client.execute_command(
            "XREADGROUP", "GROUP", cfg.group, self.consumer, "COUNT",
            max(1, count // len(names)), "BLOCK", max(1, round(cfg.read_block * 1000)),
            "STREAMS", *names, *([">"] * len(names)))
        return list(reply.items() if isinstance(reply, dict) else reply or ())

