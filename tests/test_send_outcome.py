"""What a send reports when the network fails under it (`SendFailed`), through a TCP
forwarder in front of a private redis-server (tests/helpers/netfault.py).

The case that mattered: a partition on the reply path only. The request reaches Redis and
is executed, the reply never comes. A send must then neither store the job twice (its own
retries, and redis-py's, resend the request) nor say "unavailable" as if nothing happened:
it stores once, and either returns the id (the partition healed within the retry budget) or
raises SendFailed with ``outcome == "unknown"`` and the key, within its documented bound.
A request that never reached Redis (nothing listens) says ``"not stored"``. Sync, async
and send_many. A send repeated by the caller is a send of its own (stored again: the
workers' dedup is what makes that harmless), as before.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._producer.batching import SEND_CHUNK
from streamwork._redis.server import RedisServer, free_port
from streamwork._wire.keys import StreamKeys
from tests.helpers.netfault import Forwarder, NetFaults

STREAM = "outcome"
#: short timeouts (URL options win over the producer's defaults): a send's bound is
#: RETRY + 2 x (CONNECT + SOCKET) = 5 s
SOCKET, CONNECT, RETRY = 1.0, 0.5, 2.0
QUERY = f"?socket_timeout={SOCKET}&socket_connect_timeout={CONNECT}"
BOUND = RETRY + 2 * (CONNECT + SOCKET)
#: what a busy machine may add to the bound (scheduling, the forwarder thread)
SLACK = 3.0


@pytest.fixture(name="net")
def _net() -> Iterator[NetFaults]:
    with NetFaults() as net:
        yield net


@pytest.fixture(name="server")
def _server(make_server: Callable[..., RedisServer]) -> RedisServer:
    return make_server()


@pytest.fixture(name="r")
def _r(server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the server itself (not through the forwarder)."""
    client = redis.Redis.from_url(server.url)
    yield client
    client.close()


def _entries(r: redis.Redis, key: str) -> int:
    """How many entries of ``STREAM`` carry job ``key``."""
    return sum(1 for _, fields in r.xrange(STREAM) if key.encode() in fields[b"d"])


def _heal_after(net: NetFaults, fwd: Forwarder, seconds: float) -> threading.Thread:
    def heal() -> None:
        time.sleep(seconds)  # the partition's length, not an assertion
        net.heal(fwd)

    thread = threading.Thread(target=heal, daemon=True)
    thread.start()
    return thread


def test_reply_lost_for_good_raises_unknown_within_bound_and_stores_once(
        server: RedisServer, net: NetFaults, r: redis.Redis) -> None:
    """Replies dropped for longer than the send's bound: SendFailed("unknown", the key)
    within the bound; the job (its first request reached Redis) is in the stream once, and
    the send's marker is kept a while (the request, retried or arriving late, is not
    stored again meanwhile)."""
    fwd = net.forwarder(server.port)
    with sw.Producer.from_url(fwd.url + QUERY, retry_timeout=RETRY) as p:
        assert p.send_bound == BOUND
        p.send(STREAM, {"warm": 1})  # the pooled connection exists before the cut
        with net.partition(fwd, replies_only=True):
            started = time.monotonic()
            with pytest.raises(sw.SendFailed) as caught:
                p.send(STREAM, {"n": 1}, key="k-lost")
            took = time.monotonic() - started
            err = caught.value
            assert isinstance(err, sw.RedisUnavailable)  # callers catching that still do
            assert (err.outcome, err.keys, err.stream) == ("unknown", ["k-lost"], STREAM)
            assert took <= BOUND + SLACK, f"send blocked {took:.1f} s, bound {BOUND} s"
            assert "k-lost" in str(err) and "same key" in str(err)
            assert _entries(r, "k-lost") == 1, "the request reached Redis: stored once"
        markers = list(r.scan_iter(match="{outcome}:sent:*"))
        assert len(markers) == 2  # the warm-up send's and this one's
        assert all(0 < r.pttl(m) <= p.marker_ttl_ms for m in markers)


@pytest.mark.parametrize("delayed", [False, True])
def test_reply_lost_then_healed_within_budget_returns_the_id_of_one_copy(
        server: RedisServer, net: NetFaults, r: redis.Redis, delayed: bool) -> None:
    """Replies dropped for a moment shorter than the retry budget: the send's retries
    (each a resend of the request) find it stored: one copy, and its id (a delayed one's
    key) returned. On today's producer this stored the job twice."""
    fwd = net.forwarder(server.port)
    options: dict[str, Any] = {"delay": 60} if delayed else {}
    with sw.Producer.from_url(fwd.url + QUERY, retry_timeout=RETRY + 6) as p:
        p.send(STREAM, {"warm": 1}, **options)  # its script is loaded before the cut
        net.cut(fwd, replies_only=True)
        healer = _heal_after(net, fwd, SOCKET + 1.5)
        got = p.send(STREAM, {"n": 2}, key="k-healed", **options)
        healer.join()
    if delayed:
        assert got == "k-healed"
        members = r.zrange(StreamKeys.for_stream(STREAM).delayed, 0, -1)
        assert sum(1 for m in members if b"k-healed" in m) == 1
        return
    assert _entries(r, "k-healed") == 1
    [(entry, _)] = [(i, f) for i, f in r.xrange(STREAM) if b"k-healed" in f[b"d"]]
    assert got == entry.decode()


def test_nothing_listening_raises_not_stored() -> None:
    """No server at the address: every attempt fails to connect, so the job is known not
    stored (and the message says sending again is safe)."""
    url = f"redis://127.0.0.1:{free_port()}/0{QUERY}"
    with sw.Producer.from_url(url, retry_timeout=0.5) as p, \
            pytest.raises(sw.SendFailed) as caught:
        p.send(STREAM, {"n": 3}, key="k-none")
    assert (caught.value.outcome, caught.value.keys) == ("not stored", ["k-none"])
    assert "NOT stored" in str(caught.value)


def test_async_reply_lost_raises_unknown_and_stores_once(
        server: RedisServer, net: NetFaults, r: redis.Redis) -> None:
    """AsyncProducer: the same as the sync one."""
    fwd = net.forwarder(server.port)

    async def main() -> tuple[float, Any]:
        async with sw.AsyncProducer.from_url(fwd.url + QUERY, retry_timeout=RETRY) as p:
            await p.send(STREAM, {"warm": 1})
            with net.partition(fwd, replies_only=True):
                started = time.monotonic()
                try:
                    await p.send(STREAM, {"n": 4}, key="k-async")
                    err: Any = None
                except sw.SendFailed as exc:
                    err = exc
                took = time.monotonic() - started
            return took, err

    took, err = asyncio.run(main())
    assert err is not None and (err.outcome, err.keys) == ("unknown", ["k-async"])
    assert took <= BOUND + SLACK
    assert _entries(r, "k-async") == 1


def test_send_many_reply_lost_says_which_jobs(
        server: RedisServer, net: NetFaults, r: redis.Redis) -> None:
    """send_many of two chunks whose first one loses its reply: SendFailed names that
    chunk's keys as unknown (stored once or not at all) and the second chunk's as
    unsent."""
    fwd = net.forwarder(server.port)
    keys = [f"m-{i}" for i in range(SEND_CHUNK + 5)]
    payloads = [{"i": i} for i in range(len(keys))]
    with sw.Producer.from_url(fwd.url + QUERY, retry_timeout=RETRY) as p:
        p.send_many(STREAM, [{"warm": 1}])  # produce.lua is loaded: no NOSCRIPT round trip
        with net.partition(fwd, replies_only=True), pytest.raises(sw.SendFailed) as caught:
            p.send_many(STREAM, payloads, keys)
        err = caught.value
        assert err.outcome == "unknown"
        assert err.keys == keys[:SEND_CHUNK]
        assert err.stored == {} and err.unsent == keys[SEND_CHUNK:]
        # "unknown": the chunk is stored once or not at all (its request, some 60 kB, may
        # not get through whole when the ACKs of the reply path are dropped too), never twice
        stored = r.xlen(STREAM)
        assert stored in (1, 1 + SEND_CHUNK), "the first chunk stored once or not at all"
        ids = p.send_many(STREAM, payloads[SEND_CHUNK:], err.unsent)
        assert ids == [i.decode() for i, _ in r.xrange(STREAM)][stored:]


def test_send_many_later_chunk_fails_and_earlier_ids_are_kept(
        server: RedisServer, net: NetFaults, r: redis.Redis) -> None:
    """The first chunk answered, the second one never reaches Redis (nothing listens any
    more by then): SendFailed says "not stored" for the second chunk's keys, and gives the
    first chunk's ids in ``stored``."""
    proxy = net.forwarder(server.port)
    n = SEND_CHUNK
    keys = [f"c-{i}" for i in range(n + 3)]
    with sw.Producer.from_url(proxy.url + QUERY, retry_timeout=0.5) as p:
        calls = {"n": 0}
        real = p._scripts.run

        def run(call: Any, client: Any = None) -> Any:
            calls["n"] += 1
            if calls["n"] == 2:  # between the chunks: the forwarder goes away
                proxy.close()
                p._redis.connection_pool.disconnect()
            return real(call, client)

        p._scripts.run = run  # type: ignore[method-assign]
        with pytest.raises(sw.SendFailed) as caught:
            p.send_many(STREAM, list(range(len(keys))), keys)
    err = caught.value
    assert err.outcome == "not stored", str(err)
    assert err.keys == keys[n:] and err.unsent == []
    assert list(err.stored) == keys[:n]
    assert [i.decode() for i, _ in r.xrange(STREAM)] == list(err.stored.values())
