"""Joins under faults: 1,000 joins of 10 children each (items -> album), run by two
worker processes that are SIGKILLed again and again while the redis-server (appendfsync
always) is crashed and restarted once. Every callback must run exactly once, after all of
its children, with every child's outcome; a join whose policy dead-letters on failure and
whose child failed gets no callback but a dead letter; nothing stays pending.

Run with ``pytest -s`` to see the figures; the long variant needs STREAMWORK_SOAK=1.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._wire.keys import StreamKeys
from streamwork.testing import stream_idle, wait_for
from tests.helpers.looks import safe
from tests.workers.joins import ALBUMS, COVERS, ITEMS, effects, seen

TARGETS = ("tests.workers.joins:Item", "tests.workers.joins:Album")
SPREAD = (*TARGETS, "tests.workers.joins:Cover")
GROUP = "photos"
CHILDREN = 10



def _plan(joins: int) -> list[tuple[str, str, bool]]:
    """Each join's key, policy and whether its last child fails: one join in ten has a
    failing child; of those, every other one dead-letters its callback."""
    return [(f"album-{j}", "dead" if j % 20 == 10 else "run", j % 10 == 0)
            for j in range(joins)]


def _send(url: str, plan: list[tuple[str, str, bool]], rnd: random.Random,
          spread: bool) -> None:
    with sw.Producer.from_url(url) as producer:
        for key, policy, failing in plan:
            children = [sw.Job(COVERS if spread and n % 2 else ITEMS,
                               {"n": n, "sleep": rnd.uniform(0.0, 0.01),
                                "dead": failing and n == CHILDREN - 1})
                        for n in range(CHILDREN)]
            producer.send_join(children, then=sw.Job(ALBUMS, {"album": key}), key=key,
                               on_failure=policy)


def _settled(r: redis.Redis, fired: int, dead: int, streams: tuple[str, ...]) -> bool:
    return (r.hlen(effects(ALBUMS)) >= fired
            and r.xlen(StreamKeys.for_stream(ALBUMS).dead) >= dead
            and all(stream_idle(r, s, GROUP) for s in streams))


def join_chaos(url: str, spawn_worker: Callable[..., subprocess.Popen[bytes]],
               joins: int, kills: int, every: float, seed: int,
               crash: Callable[[], None] | None = None, r: Any = None,
               env: dict[str, str] | None = None, spread: bool = False) -> dict[str, Any]:
    """Send ``joins`` joins, run two worker processes of both streams, SIGKILL one at
    random every ``every`` s ``kills`` times (``crash`` the server halfway, if given),
    then check every callback once with all its children's outcomes. ``r``: a client of
    the server (a Cluster's), ``env``: the workers' environment (their stream names);
    ``spread``: every other child goes to a second stream (COVERS)."""
    rnd = random.Random(seed)
    r = redis.Redis.from_url(url, socket_timeout=5) if r is None else r
    plan = _plan(joins)
    _send(url, plan, rnd, spread)
    children_streams = (ITEMS, COVERS) if spread else (ITEMS,)
    fired = [key for key, policy, failing in plan if not (failing and policy == "dead")]
    dead = [key for key, policy, failing in plan if failing and policy == "dead"]

    def spawn() -> subprocess.Popen[bytes]:
        targets = SPREAD if spread else TARGETS
        return spawn_worker(targets[0], url, *targets[1:], env=env)

    procs = [spawn(), spawn()]
    wait_for(lambda: r.hlen(effects(ITEMS)) > 0, 60, interval=0.05,
             message="the first child to take effect")
    busy = 0
    for kill in range(kills):
        time.sleep(every * rnd.uniform(0.7, 1.3))  # pacing of the faults, not a check
        busy += int(safe(lambda: r.hlen(effects(ALBUMS)) < len(fired)) is True)
        victim = rnd.randrange(len(procs))
        os.kill(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait()
        if kill == kills // 2 and crash is not None:
            crash()
        procs[victim] = spawn()
    streams = (*children_streams, ALBUMS)
    wait_for(lambda: safe(lambda: _settled(r, len(fired), len(dead), streams)), 180,
             interval=0.2,
             message="every join to fire (or be dead-lettered) after the faults")

    album_runs = {k.decode(): int(v) for k, v in r.hgetall(effects(ALBUMS)).items()}
    saw = {k.decode(): v.decode() for k, v in r.hgetall(seen(ALBUMS)).items()}
    item_runs = {k.decode(): int(v) for s in children_streams
                 for k, v in r.hgetall(effects(s)).items()}
    figures = {"joins": joins, "children": joins * CHILDREN, "kills": kills,
               "kills_while_busy": busy, "callbacks_run": sum(album_runs.values()),
               "dead_lettered_joins": r.xlen(StreamKeys.for_stream(ALBUMS).dead),
               "children_per_callback": sorted({s.split(":")[0] for s in saw.values()})}
    print(f"\njoin chaos: {figures}")
    assert sorted(album_runs) == sorted(fired), "a callback missing, or one that must not run"
    twice = {k: n for k, n in album_runs.items() if n != 1}
    assert not twice, f"callbacks run more than once: {list(twice.items())[:5]}"
    for key, policy, failing in plan:
        if failing and policy == "dead":
            continue
        want = f"10:9:1:{sum(range(CHILDREN - 1))}" if failing else f"10:10:0:{sum(range(10))}"
        assert saw[key] == want, f"{key}: the callback saw {saw[key]}, not {want}"
    ran_twice = {k: n for k, n in item_runs.items() if n != 1}
    assert not ran_twice, f"children that took effect twice: {list(ran_twice.items())[:5]}"
    assert len(item_runs) == joins * CHILDREN - sum(f for _, _, f in plan)
    with sw.Producer.from_url(url) as producer:
        for key in dead:
            st = producer.join_status(ALBUMS, key)
            assert (st.state, st.failed, st.pending) == ("dead", 1, 0), (key, st)
        for key in rnd.sample(fired, 20):
            st = producer.join_status(ALBUMS, key)
            assert (st.state, st.pending) == ("fired", 0), (key, st)
    for stream in streams:
        assert r.xpending(stream, GROUP)["pending"] == 0
    assert sum(r.xlen(StreamKeys.for_stream(s).dead) for s in children_streams) == sum(
        f for _, _, f in plan)
    for proc in procs:
        assert proc.poll() is None, "a worker that was not killed died on its own"
    return figures


def _crash(server: Any) -> Callable[[], None]:
    def crash() -> None:
        server.kill()  # appendfsync always: nothing acknowledged is lost
        time.sleep(0.3)  # the outage (not a check)
        server.start()
    return crash


@pytest.mark.timeout(300)
def test_joins_survive_sigkills_and_a_redis_crash(
        make_server: Callable[..., Any],
        spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """1,000 joins of 10 children, 6 worker SIGKILLs and one redis-server crash: every
    callback runs once, after all of its children, and sees each child's outcome."""
    server = make_server(appendfsync="always")
    join_chaos(server.url, spawn_worker, joins=1000, kills=6, every=1.0, seed=11,
               crash=_crash(server))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_joins_soak(make_server: Callable[..., Any],
                    spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    if not os.environ.get("STREAMWORK_SOAK"):
        pytest.skip("set STREAMWORK_SOAK=1")
    server = make_server(appendfsync="always")
    join_chaos(server.url, spawn_worker, joins=5000, kills=20, every=1.0, seed=12,
               crash=_crash(server))
