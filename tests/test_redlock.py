"""Redlock over 5 private redis-server masters: quorum, validity, hygiene, fencing, faults.

Covers fencing tokens on every grant (a quorum max+1 compare-and-set) and the fenced write
that rejects lower tokens, validity tracked on a monotonic clock, acquisition hygiene
(random values, jittered retries, a failed attempt releases everything), a lock granted
only with a quorum, the crash-restart hazard (a master back empty) and clock jumps. Sleeps
only wait for TTLs to run out; assertions are on Redis state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from streamwork._lock.core import DEFAULT_NODE_TIMEOUT, drift_allowance, quorum, validity
from streamwork._lock.redlock import AsyncRedlock, Redlock, async_fenced_set, fenced_set
from streamwork._redis.server import RedisServer
from streamwork._wire.keys import redlock_fence_key as fence_key
from streamwork._wire.keys import redlock_key as lock_key
from streamwork.errors import ConfigError, LockLost, LockNotAcquired
from streamwork.testing import await_for, wait_for

N = 5
TTL = 10.0


@pytest.fixture(scope="module")
def servers() -> Iterator[list[RedisServer]]:
    started: list[RedisServer] = []
    try:
        for _ in range(N):
            started.append(RedisServer().start())
        yield started
    finally:
        for server in started:
            server.close()


@pytest.fixture
def nodes(servers: list[RedisServer]) -> Iterator[list[redis.Redis]]:
    """Every master running and empty; plain clients to inspect them."""
    for server in servers:
        server.start()  # no-op if running; restarts the ones a previous test killed
    clients = [redis.Redis.from_url(s.url, socket_timeout=5) for s in servers]
    for client in clients:
        client.flushall()
    yield clients
    for client in clients:
        client.close()


@pytest.fixture
def urls(servers: list[RedisServer], nodes: list[redis.Redis]) -> list[str]:
    return [s.url for s in servers]


@pytest.fixture
def make_lock(urls: list[str]) -> Iterator[Callable[..., Redlock]]:
    made: list[Redlock] = []

    def make(**options: Any) -> Redlock:
        made.append(Redlock(urls, **options))
        return made[-1]

    yield make
    for lock in made:
        lock.close()


class FakeClock:
    """Monotonic seconds under test control; each call advances the time by ``step``."""

    def __init__(self, start: float = 0.0, step: float = 0.0) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> float:
        now = self.now
        self.now += self.step
        return now


def values(clients: list[redis.Redis], key: str) -> list[bytes | str | None]:
    return [c.get(key) for c in clients]


def keys_gone(clients: list[redis.Redis], key: str) -> Callable[[], bool]:
    return lambda: all(c.exists(key) == 0 for c in clients)


# ------------------------------------------------------------------------------ pure math


def test_quorum_and_validity_math() -> None:
    assert [quorum(n) for n in range(1, 8)] == [1, 2, 2, 3, 3, 4, 4]
    assert drift_allowance(10.0) == pytest.approx(0.102)
    assert validity(10.0, 1.5) == pytest.approx(10.0 - 1.5 - 0.102)
    assert validity(10.0, 9.9) < 0


def test_config_errors(urls: list[str]) -> None:
    with pytest.raises(ConfigError, match="ttl"):
        Redlock(urls, ttl=0.001)
    with pytest.raises(ConfigError, match="masters"):
        Redlock([])
    with pytest.raises(ConfigError, match="masters"):
        Redlock([urls[0], urls[0], urls[1]])
    with Redlock(urls) as lock:
        with pytest.raises(ConfigError, match="resource"):
            lock.acquire("has{brace}")
        with pytest.raises(ConfigError, match="blocking_timeout"):
            lock.acquire("x", blocking_timeout=-1)
    assert lock_key("invoice-7") == "redlock:{invoice-7}"
    assert fence_key("invoice-7") == "redlock:{invoice-7}:fence"


# ------------------------------------------------------------------------------ (a) basics


def test_acquire_release_and_context_manager(
    nodes: list[redis.Redis], make_lock: Callable[..., Redlock]
) -> None:
    lock = make_lock(ttl=TTL)
    key = lock_key("invoice-7")
    held = lock.acquire("invoice-7")
    assert 0 < held.valid_for <= TTL - drift_allowance(TTL)
    assert held.fencing_token >= 1
    stored = values(nodes, key)
    assert len(set(stored)) == 1 and stored[0] is not None and len(stored[0]) == 40
    assert all(0 < c.pttl(key) <= TTL * 1000 for c in nodes)

    with pytest.raises(LockNotAcquired) as refused:  # held: nobody else gets it
        make_lock().acquire("invoice-7")
    assert (refused.value.granted, refused.value.answered, refused.value.quorum) == (0, 5, 3)
    assert values(nodes, key) == stored  # the refused attempt did not touch our lock

    for c in nodes:
        c.pexpire(key, 2000)
    assert held.extend() > 2.0
    assert all(c.pttl(key) > 2000 for c in nodes)
    assert held.release() is True
    assert keys_gone(nodes, key)()
    assert held.valid_for == 0 and not held.held
    assert held.release() is False  # idempotent

    with lock.acquire("invoice-7") as again:
        assert again.held and all(c.exists(key) for c in nodes)
        assert again.fencing_token > held.fencing_token
    assert keys_gone(nodes, key)()


def test_accepts_client_objects(servers: list[RedisServer], nodes: list[redis.Redis]) -> None:
    lock = Redlock(nodes)  # caller's clients: used as they are, not closed by the lock
    with lock.acquire("clients") as held:
        assert held.held
    lock.close()
    assert all(c.ping() for c in nodes)


# --------------------------------------------------------------- (b)(c)(d) fault class 10


def test_quorum_with_masters_down_then_restored(
    servers: list[RedisServer], nodes: list[redis.Redis], make_lock: Callable[..., Redlock]
) -> None:
    lock = make_lock(ttl=TTL, retry_delay=0.1)
    key = lock_key("q")

    servers[3].kill()
    servers[4].kill()
    with lock.acquire("q") as held:  # (b) 3 of 5 answer: granted
        assert held.valid_for > 0
        assert all(c.exists(key) for c in nodes[:3])

    servers[2].kill()  # (c) 2 of 5 answer: refused within a bound, nothing left behind
    blocking = 0.5
    started = time.monotonic()
    with pytest.raises(LockNotAcquired) as refused:
        lock.acquire("q", blocking_timeout=blocking)
    elapsed = time.monotonic() - started
    # the last attempt starts before the timeout; an attempt is at most 2 rounds (acquire
    # and release) over N masters, each bounded by connect + read timeouts
    attempt_bound = 2 * N * 2 * DEFAULT_NODE_TIMEOUT
    assert elapsed < blocking + attempt_bound + 0.5
    assert elapsed >= blocking  # it did keep retrying until the timeout
    err = refused.value
    assert (err.granted, err.answered, err.total, err.quorum) == (2, 2, 5, 3)
    assert isinstance(err.__cause__, redis.ConnectionError)
    assert keys_gone(nodes[:2], key)()

    started = time.monotonic()
    with pytest.raises(LockNotAcquired):  # try once
        lock.acquire("q")
    assert time.monotonic() - started < attempt_bound + 0.5
    assert keys_gone(nodes[:2], key)()

    for server in servers[2:]:  # (d) restore: the same Redlock object succeeds again
        server.start()
    with lock.acquire("q") as held:
        assert held.valid_for > 0
        assert all(c.exists(key) for c in nodes)
    assert keys_gone(nodes, key)()


def test_exhaustive_masks_with_foreign_values(
    nodes: list[redis.Redis], make_lock: Callable[..., Redlock]
) -> None:
    """(d) redsync-style: masked masters hold a foreign lock; success iff >= 3 are free."""
    lock = make_lock(ttl=TTL)
    key = lock_key("mask")
    foreign = b"someone-else"
    for mask in range(2**N):
        for c in nodes:
            c.delete(key)
        taken = [bool(mask >> i & 1) for i in range(N)]
        for c, is_taken in zip(nodes, taken, strict=True):
            if is_taken:
                c.set(key, foreign, px=60_000)
        free = taken.count(False)
        try:
            held = lock.acquire("mask")
        except LockNotAcquired as exc:
            assert free < 3, f"mask {mask:05b}: refused with {free} free"
            assert exc.granted == free
            for c, is_taken in zip(
                nodes, taken, strict=True
            ):  # nothing of ours remains, foreign kept
                assert c.get(key) == (foreign if is_taken else None), f"mask {mask:05b}"
        else:
            assert free >= 3, f"mask {mask:05b}: granted with only {free} free"
            ours = {c.get(key) for c, t in zip(nodes, taken, strict=True) if not t}
            assert len(ours) == 1 and foreign not in ours
            assert held.release() is True
            for c, is_taken in zip(nodes, taken, strict=True):
                assert c.get(key) == (foreign if is_taken else None), f"mask {mask:05b}"


# -------------------------------------------------------------------- (f)(g) expiry hygiene


def test_expired_holder_release_keeps_new_holders_lock(
    nodes: list[redis.Redis], make_lock: Callable[..., Redlock]
) -> None:
    key = lock_key("f")
    a = make_lock(ttl=0.3).acquire("f")
    wait_for(keys_gone(nodes, key), 5.0, 0.01, message="the lock keys to expire")
    b = make_lock(ttl=TTL).acquire("f")
    b_values = values(nodes, key)
    assert a.valid_for == 0
    assert a.release() is False
    assert values(nodes, key) == b_values  # B's lock untouched everywhere
    assert b.release() is True


def test_extend_after_expiry_is_lost_and_never_recreates(
    nodes: list[redis.Redis], make_lock: Callable[..., Redlock]
) -> None:
    key = lock_key("g")
    # real clock: the local deadline has passed
    held = make_lock(ttl=0.3).acquire("g")
    wait_for(keys_gone(nodes, key), 5.0, 0.01, message="the lock keys to expire")
    with pytest.raises(LockLost):
        held.extend()
    assert keys_gone(nodes, key)()
    with pytest.raises(LockLost):  # LOST is final
        held.extend()

    # frozen clock: locally still valid, so the compare-and-PEXPIRE script itself must
    # refuse to touch the expired keys
    frozen = make_lock(ttl=0.3, clock=FakeClock()).acquire("g")
    assert frozen.valid_for > 0
    wait_for(keys_gone(nodes, key), 5.0, 0.01, message="the lock keys to expire")
    with pytest.raises(LockLost, match="0 of 5"):
        frozen.extend(ttl=TTL)
    assert keys_gone(nodes, key)()
    assert not frozen.held


# -------------------------------------------------------------------- (h) validity / clocks


def test_validity_counts_time_spent_acquiring(
    nodes: list[redis.Redis], make_lock: Callable[..., Redlock]
) -> None:
    clock = FakeClock(step=1.0)  # every clock reading is one second later
    lock = make_lock(ttl=TTL, clock=clock)
    held = lock.acquire("h")
    clock.step = 0.0
    spent = clock.now  # time passed since the first reading, taken before the first SET
    assert spent >= 2.0
    assert held.valid_for == pytest.approx(TTL - drift_allowance(TTL) - spent)

    clock.now += 3.0  # extend measures from when it is sent
    assert held.extend() == pytest.approx(TTL - drift_allowance(TTL))
    held.release()

    clock.step = TTL  # acquisition slower than the TTL: refused, and cleaned up
    with pytest.raises(LockNotAcquired):
        lock.acquire("h")
    assert keys_gone(nodes, lock_key("h"))()


def test_wall_clock_jumps_do_not_change_validity(
    nodes: list[redis.Redis], make_lock: Callable[..., Redlock], monkeypatch: pytest.MonkeyPatch
) -> None:
    jumps = iter([3600.0, -3600.0] * 1000)
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + next(jumps))
    lock = make_lock(ttl=TTL, clock=FakeClock(start=100.0))
    held = lock.acquire("wall")
    assert held.valid_for == pytest.approx(TTL - drift_allowance(TTL))
    assert held.extend() == pytest.approx(TTL - drift_allowance(TTL))
    assert held.release() is True


# ------------------------------------------------------------------------ (i) fencing tokens


def test_fencing_tokens_strictly_increase_across_restarts(
    servers: list[RedisServer], nodes: list[redis.Redis], make_lock: Callable[..., Redlock]
) -> None:
    first, second = make_lock(), make_lock()
    tokens: list[int] = []
    for i in range(8):
        with (first if i % 2 else second).acquire("inv") as held:
            tokens.append(held.fencing_token)
        if i in (2, 4, 6):  # one master at a time restarts empty (no AOF)
            servers[i // 2 - 1].restart()
    assert tokens == sorted(set(tokens)), tokens
    with first.acquire("other") as held:  # per resource
        assert held.fencing_token == 1


# ------------------------------------------------------------- (j) fault class 11: restart


def test_crash_restart_hazard_is_caught_by_fencing(
    servers: list[RedisServer], nodes: list[redis.Redis], make_lock: Callable[..., Redlock]
) -> None:
    store = nodes[1]  # the protected resource lives in Redis on a master that stays up
    servers[3].kill()
    servers[4].kill()
    a = make_lock(ttl=TTL).acquire("acct")  # A holds masters 0, 1, 2
    servers[3].start()
    servers[4].start()
    assert fenced_set(store, "acct:balance", a.fencing_token, "A1")

    servers[0].restart()  # one of A's masters comes back at once, empty
    b = make_lock(ttl=TTL).acquire("acct")  # the spec's hazard: B gets 0, 3, 4
    assert a.held and b.held  # both believe they hold it...
    assert b.fencing_token > a.fencing_token  # ...but tokens tell them apart
    assert fenced_set(store, "acct:balance", b.fencing_token, "B")
    assert not fenced_set(store, "acct:balance", a.fencing_token, "A2")
    assert store.hget("acct:balance", "value") == b"B"
    assert int(store.hget("acct:balance", "token") or 0) == b.fencing_token


def test_delayed_restart_keeps_the_lock_exclusive(
    servers: list[RedisServer], nodes: list[redis.Redis], make_lock: Callable[..., Redlock]
) -> None:
    ttl = 0.6
    servers[3].kill()
    servers[4].kill()
    a = make_lock(ttl=ttl).acquire("acct")  # A holds masters 0, 1, 2
    servers[3].start()
    servers[4].start()
    servers[0].kill()  # crashed, restarted only after more than the TTL
    b_lock = make_lock(ttl=TTL)
    while a.valid_for > 0:
        try:
            early = b_lock.acquire("acct")
        except LockNotAcquired:
            continue
        # an attempt begun just before A's validity ended may finish after it (a slow
        # machine): it must never be granted while A still counts as holding the lock
        assert a.valid_for == 0, "B was granted the lock while A's lease was still valid"
        early.release()
    wait_for(keys_gone(nodes[1:3], lock_key("acct")), 5.0, 0.01,
             message="the lock keys to expire")
    servers[0].start()
    with b_lock.acquire("acct") as b:
        assert b.fencing_token > a.fencing_token


# --------------------------------------------------------------- (k) fault class 12: clocks


def test_server_clock_jump_no_resurrection(
    nodes: list[redis.Redis], make_lock: Callable[..., Redlock]
) -> None:
    key = lock_key("jump")
    a = make_lock(ttl=TTL).acquire("jump")
    for c in nodes[:3]:  # three masters' clocks jump forward: A's keys expire there
        c.pexpire(key, 1)
    wait_for(keys_gone(nodes[:3], key), 5.0, 0.01, message="the lock keys to expire")
    b = make_lock(ttl=TTL).acquire("jump")
    b_values = values(nodes[:3], key)
    assert b.fencing_token > a.fencing_token

    with pytest.raises(LockLost, match="2 of 5"):
        a.extend()
    assert values(nodes[:3], key) == b_values  # B's keys untouched, nothing resurrected
    assert keys_gone(nodes[3:], key)()  # A gave back the minority it still held
    assert not a.held and b.held

    assert fenced_set(nodes[4], "res", b.fencing_token, "B")
    assert not fenced_set(nodes[4], "res", a.fencing_token, "A")
    assert nodes[4].hget("res", "value") == b"B"


# ---------------------------------------------------------------- interrupted acquisition


class Interrupt(BaseException):
    pass


def test_interrupted_acquisition_releases_everything(
    servers: list[RedisServer], nodes: list[redis.Redis]
) -> None:
    key = lock_key("intr")

    class Interrupting(redis.Redis):
        def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
            if numkeys == 2:  # the acquire script (lock key + fence key)
                raise Interrupt
            return super().evalsha(sha, numkeys, *keys_and_args)

    last = Interrupting.from_url(servers[-1].url)
    lock = Redlock([*nodes[:-1], last])
    with pytest.raises(Interrupt):
        lock.acquire("intr")  # 4 masters already granted it when the 5th interrupts
    assert keys_gone(nodes, key)()
    last.close()


async def test_cancelled_async_acquisition_releases_everything(
    servers: list[RedisServer], nodes: list[redis.Redis]
) -> None:
    key = lock_key("cancel")
    stall = asyncio.Event()

    class Stalling(redis.asyncio.Redis):
        async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
            if numkeys == 2:
                await stall.wait()
            return await super().evalsha(sha, numkeys, *keys_and_args)

    clients: list[redis.asyncio.Redis] = [redis.asyncio.Redis.from_url(s.url) for s in servers]
    clients[-1] = Stalling.from_url(servers[-1].url)
    lock = AsyncRedlock(clients)
    task = asyncio.create_task(lock.acquire("cancel").__aenter__())
    await await_for(lambda: sum(c.exists(key) for c in nodes) >= N - 1,
                    message="the other 4 masters to grant the lock")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert keys_gone(nodes, key)()
    for client in clients:
        await client.aclose()


# -------------------------------------------------------------------------- (l) asyncio


async def test_async_with_two_and_three_masters_down(
    servers: list[RedisServer], nodes: list[redis.Redis], urls: list[str]
) -> None:
    key = lock_key("async")
    servers[3].kill()
    servers[4].kill()
    async with AsyncRedlock(urls, ttl=TTL, retry_delay=0.1) as lock:
        held = await lock.acquire("async")
        assert held.valid_for > 0 and held.fencing_token >= 1
        assert all(c.exists(key) for c in nodes[:3])
        for c in nodes[:3]:
            c.pexpire(key, 2000)
        assert await held.extend() > 2.0
        assert all(c.pttl(key) > 2000 for c in nodes[:3])
        assert await held.release() is True
        assert keys_gone(nodes[:3], key)()

        async with lock.acquire("async") as again:
            assert again.fencing_token > held.fencing_token
            assert all(c.exists(key) for c in nodes[:3])
        assert keys_gone(nodes[:3], key)()

        losing = await lock.acquire("async")
        servers[2].kill()  # quorum gone while held: extend is LOST, the rest given back
        with pytest.raises(LockLost, match="2 of 5"):
            await losing.extend()
        assert keys_gone(nodes[:2], key)()

        blocking = 0.3
        started = time.monotonic()
        with pytest.raises(LockNotAcquired) as refused:
            await lock.acquire("async", blocking_timeout=blocking)
        assert time.monotonic() - started < blocking + 2 * 2 * DEFAULT_NODE_TIMEOUT + 0.5
        assert (refused.value.granted, refused.value.answered) == (2, 2)
        assert keys_gone(nodes[:2], key)()

        for server in servers[2:]:
            server.start()
        async with lock.acquire("async") as restored:
            assert restored.fencing_token > again.fencing_token
            assert all(c.exists(key) for c in nodes)
        assert keys_gone(nodes, key)()


async def test_async_fenced_set(servers: list[RedisServer], nodes: list[redis.Redis]) -> None:
    client = redis.asyncio.Redis.from_url(servers[0].url)
    assert await async_fenced_set(client, "doc", 5, b"five")
    assert await async_fenced_set(client, "doc", 5, b"five again")  # same holder rewrites
    assert not await async_fenced_set(client, "doc", 4, b"stale")
    assert await async_fenced_set(client, "doc", 6, b"six")
    assert nodes[0].hget("doc", "value") == b"six"
    with pytest.raises(ConfigError):
        await async_fenced_set(client, "doc", -1, b"x")
    await client.aclose()
