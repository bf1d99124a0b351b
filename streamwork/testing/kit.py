"""The kit's first part: private servers, running a worker until idle, waiting without
sleeps-as-assertions, ledgers (``streamwork.testing`` exports it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from streamwork._redis.server import RedisServer, free_port
from streamwork._wire.keys import StreamKeys
from streamwork._wire.priorities import sibling_streams
from streamwork._worker.worker import StreamWorker

__all__ = [
    "Ledger", "LedgerReport", "RedisServer", "await_for", "free_port", "run_until_idle",
    "stream_idle", "wait_for",
]

T = TypeVar("T")


def _poll(predicate: Callable[[], T], deadline: float, timeout: float, message: str) -> T | None:
    """One look: the predicate's value if truthy, None to look again, or raise when late."""
    value = predicate()
    if value:
        return value
    if time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout:g}s waiting for {message}")
    return None


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
             message: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy; raise AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while (value := _poll(predicate, deadline, timeout, message)) is None:
        time.sleep(interval)
    return value


async def await_for(predicate: Callable[[], T], timeout: float = 30.0,
                    message: str = "condition") -> T:
    """``wait_for`` for async tests: polls without blocking the event loop."""
    deadline = time.monotonic() + timeout
    # polling on purpose: the state lives in Redis or another process, no event to await
    while (value := _poll(predicate, deadline, timeout, message)) is None:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    return value


@dataclass(frozen=True)
class LedgerReport:
    """What a ledger saw: keys never applied, and keys applied more than once."""

    expected: int
    applied: int
    lost: list[str]
    twice: dict[str, int]

    @property
    def exactly_once(self) -> bool:
        return not self.lost and not self.twice


class Ledger:
    """Counts effects per job key in a Redis hash, for checks of lost and doubled work."""

    def __init__(self, client: Any, name: str = "ledger") -> None:
        self.client = client
        self.name = name

    def record(self, key: str) -> None:
        self.client.hincrby(self.name, key, 1)

    def counts(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.name).items()}

    def report(self, expected: Iterable[str]) -> LedgerReport:
        counts = self.counts()
        keys = list(expected)
        return LedgerReport(
            expected=len(keys),
            applied=sum(1 for k in keys if counts.get(k, 0) > 0),
            lost=[k for k in keys if counts.get(k, 0) == 0],
            twice={k: n for k, n in counts.items() if n > 1},
        )


def _group_idle(exists: Any, groups: Any, last: Any, group: str) -> bool:
    """``group`` has read every entry of a stream and acknowledged all (False if the
    stream or the group does not exist), from EXISTS, XINFO GROUPS and XREVRANGE COUNT 1."""
    if not exists or isinstance(groups, Exception):
        return False
    for raw in groups:
        g = _fields(raw)
        if (g["name"].decode() if isinstance(g["name"], bytes) else g["name"]) == group:
            break
    else:
        return False
    lag = g.get("lag")
    last_id = last[0][0] if last else b"0-0"
    return bool(g["pending"] == 0 and (lag == 0 or (lag is None and
                                        g["last-delivered-id"] == last_id)))


def _fields(info: Any) -> dict[str, Any]:
    """One group of an XINFO GROUPS reply with str field names: redis-py parses it into a
    dict, except in a cluster pipeline (bytes field names)."""
    pairs = info.items() if isinstance(info, dict) else zip(info[::2], info[1::2], strict=True)
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in pairs}


def stream_idle(client: Any, stream: str, group: str) -> bool:
    """True when ``group`` has read every entry of the stream, of its priority levels and
    of its retry stream, acknowledged all, and nothing is delayed or waiting for a retry.

    One MULTI/EXEC looks at all of them at once (they share a hash slot): looked at one
    after the other, a job moving on meanwhile (a retry promoted from the retry ZSET to
    the retry stream, say) could be missed in both places."""
    keys = StreamKeys.for_stream(stream)
    gkeys = keys.group(group)
    pipe = client.pipeline(transaction=True)
    for name in (stream, gkeys.retry, *sibling_streams(keys)):  # and the priority levels
        pipe.exists(name)
        pipe.xinfo_groups(name)  # an error for a missing stream: judged by EXISTS
        pipe.xrevrange(name, count=1)
    pipe.zcard(keys.delayed)
    pipe.zcard(gkeys.retries)
    got = pipe.execute(raise_on_error=False)
    sides = [got[i:i + 3] for i in range(0, len(got) - 2, 3)]  # the stream, then the others
    others_idle = all(not e or _group_idle(e, groups, last, group)
                      for e, groups, last in sides[1:])
    exists, groups, last = sides[0]
    return (_group_idle(exists, groups, last, group) and others_idle
            and got[-2] == 0 and got[-1] == 0)


async def run_until_idle(worker: StreamWorker, client: Any, timeout: float = 30.0) -> None:
    """Serve ``worker`` until its group is idle (everything acked, nothing delayed), then
    stop it; raise AssertionError on timeout. ``client`` is a sync redis client used to
    look; each look runs in a thread, so the event loop the worker serves on never waits
    for Redis."""
    task = asyncio.create_task(worker.serve())
    cfg = worker.config

    def idle() -> bool:  # every partition there is (a partitioned stream) is idle
        there = [s for s in cfg.streams if client.exists(s)]
        return bool(there) and all(stream_idle(client, s, cfg.group) for s in there)

    deadline = time.monotonic() + timeout
    try:
        while True:
            await asyncio.sleep(0.02)
            if task.done():
                task.result()
                raise AssertionError("worker stopped on its own before the stream was idle")
            if await asyncio.to_thread(idle):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"stream {cfg.stream!r} not idle after {timeout:g}s: "
                                     f"{worker!r}")
    finally:
        worker.stop()
        await task
