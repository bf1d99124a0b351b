"""Join (fan-in) workers for the join fault tests: items (the children) -> gallery (the
callbacks). Both record their effects with staged writes (exactly once with their
completion): an item HINCRBY of its key in ``{<items>}:effects``; an album HINCRBY of its
join's key in ``{<albums>}:effects`` and what it saw of its join in ``{<albums>}:seen``
("<children>:<done>:<failed>"). An item whose payload says ``dead`` is dead-lettered; a
payload's ``sleep`` keeps it in flight long enough to be killed."""

from __future__ import annotations

import asyncio
import os
from typing import Final

import streamwork as sw

ITEMS: Final = os.environ.get("SW_JOIN_ITEMS", "items")
ALBUMS: Final = os.environ.get("SW_JOIN_ALBUMS", "gallery")  # another master than items
#: a second children's stream (on a 3-master cluster, on the third master)
COVERS: Final = os.environ.get("SW_JOIN_COVERS", "covers")


def effects(stream: str) -> str:
    """The hash where ``stream``'s handler counts its effects (in the stream's slot)."""
    return "{" + stream + "}:effects"


def seen(stream: str) -> str:
    """The hash where the callback records what it saw of each join."""
    return "{" + stream + "}:seen"


class _Step(sw.StreamWorker):
    group = "photos"
    concurrency = 8
    batch_size = 20
    visibility_timeout = 1.0
    reclaim_interval = 0.3
    retry_delay = 0.05
    retry_max_delay = 0.5
    read_block = 0.1
    max_deliveries = 30
    dedup_window = 600.0


class Item(_Step):
    """A child: resizes one image (its payload's ``n``), or is dead-lettered."""

    stream = ITEMS

    async def handle(self, msg: sw.Message) -> int:
        pause = float(msg.payload.get("sleep", 0))
        if pause:
            await asyncio.sleep(pause)
        if msg.payload.get("dead"):
            raise sw.DeadLetter("the image is corrupt")
        msg.stage("HINCRBY", [effects(msg.stream)], [msg.key, 1])
        return int(msg.payload["n"])


class Cover(Item):
    """A child on another stream (another master of a cluster)."""

    stream = COVERS


class Album(_Step):
    """The callback: builds the album from its children's outcomes."""

    stream = ALBUMS

    async def handle(self, msg: sw.Message) -> None:
        results = await msg.join_results()
        done = sum(c.ok for c in results)
        total = sum(c.result for c in results if c.ok)
        msg.stage("HINCRBY", [effects(ALBUMS)], [msg.key, 1])
        msg.stage("HSET", [seen(ALBUMS)], [msg.key, f"{len(results)}:{done}:"
                                                    f"{len(results) - done}:{total}"])
