"""faults.classify sorts the errors a real server returns into ride-out / rebuild / stop.
Each error is produced by a real redis-server in that state, not typed
by hand, except the cluster-only codes, which a single server cannot return."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.exceptions

from streamwork._redis.faults import Fault, classify

SCRIPT_WRITES = "return redis.call('SET', KEYS[1], 'x')"


def _error(fn: Callable[[], Any]) -> BaseException:
    with pytest.raises(redis.exceptions.RedisError) as info:
        fn()
    return info.value


def test_out_of_memory_is_transient(r: redis.Redis) -> None:
    """OOM from a command, from a flagged script refused whole, and from inside a script."""
    r.config_set("maxmemory", 1)
    try:
        errors = [
            _error(lambda: r.set("k", "v")),
            _error(lambda: r.eval("#!lua\n" + SCRIPT_WRITES, 1, "k")),
            _error(lambda: r.eval(SCRIPT_WRITES, 1, "k")),
        ]
    finally:
        r.config_set("maxmemory", 0)
    assert [classify(e) for e in errors] == [Fault.TRANSIENT] * 3, errors


def test_missing_group_or_stream_is_gone(r: redis.Redis) -> None:
    """NOGROUP from XREADGROUP, from XPENDING inside a script, and UNBLOCKED for a blocked
    read whose stream was deleted."""
    r.xadd("s", {"d": b"x"})
    errors = [
        _error(lambda: r.xreadgroup("g", "c", {"s": ">"})),
        _error(lambda: r.eval("return redis.call('XPENDING', KEYS[1], 'g')", 1, "s")),
    ]
    r.xgroup_create("s", "g", id="$")
    blocked = redis.Redis(connection_pool=r.connection_pool)
    caught: list[BaseException] = []

    def read() -> None:
        try:
            blocked.xreadgroup("g", "c", {"s": ">"}, block=5000)
        except redis.exceptions.RedisError as exc:
            caught.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    from streamwork.testing import wait_for

    wait_for(lambda: any(c.get("cmd") == "xreadgroup" for c in r.client_list()),
             message="the read blocked")
    r.delete("s")
    reader.join(10)
    errors += caught
    assert len(errors) == 3, errors
    assert [classify(e) for e in errors] == [Fault.GONE] * 3, errors


def test_busy_script_and_loading_and_readonly_are_transient(
        r: redis.Redis, make_server: Any) -> None:
    """BUSY while a long script runs; READONLY on a replica; connection refused."""
    r.config_set("busy-reply-threshold", 50)
    spin = ("local t = redis.call('TIME'); local s = t[1] * 1000000 + t[2] "
            "repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - s > 600000")
    other = redis.Redis(connection_pool=redis.ConnectionPool.from_url(
        f"redis://127.0.0.1:{r.connection_pool.connection_kwargs['port']}"))
    runner = threading.Thread(target=lambda: other.eval(spin, 0))
    runner.start()
    try:
        from streamwork.testing import wait_for

        busy: list[BaseException] = []

        def got_busy() -> bool:
            try:
                r.ping()
            except redis.exceptions.ResponseError as exc:
                busy.append(exc)
                return True
            return False

        wait_for(got_busy, timeout=5, interval=0.01, message="a BUSY reply")
    finally:
        runner.join(10)
        other.close()
    master, replica = make_server(), make_server()
    rep = redis.Redis.from_url(replica.url)
    rep.replicaof("127.0.0.1", master.port)
    readonly = _error(lambda: rep.set("k", "v"))
    rep.close()
    refused = _error(lambda: redis.Redis(port=1, socket_connect_timeout=0.5).ping())
    assert str(busy[0]).startswith("BUSY")
    assert [classify(e) for e in (busy[0], readonly, refused)] == [Fault.TRANSIENT] * 3


def test_cluster_codes_are_transient() -> None:
    """TRYAGAIN, CLUSTERDOWN, MASTERDOWN, LOADING (parsed as redis-py parses replies)."""
    from redis._parsers.base import BaseParser

    for reply in ("TRYAGAIN Multiple keys request during rehashing of slot",
                  "CLUSTERDOWN The cluster is down",
                  "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is no",
                  "LOADING Redis is loading the dataset in memory"):
        assert classify(BaseParser.parse_error(reply)) is Fault.TRANSIENT, reply


def test_anything_else_is_fatal(r: redis.Redis) -> None:
    """WRONGTYPE, a script error, a wrong password, a missing permission: stop loudly."""
    r.set("str", "x")
    wrongtype = _error(lambda: r.xreadgroup("g", "c", {"str": ">"}))
    script = _error(lambda: r.eval("return redis.call('NOSUCHCOMMAND')", 0))
    r.acl_setuser("limited", enabled=True, passwords=["+pw"], commands=["+ping"], keys=["*"])
    port = r.connection_pool.connection_kwargs["port"]
    wrong_password = _error(lambda: redis.Redis(port=port, username="limited",
                                                password="nope").ping())
    no_permission = _error(lambda: redis.Redis(port=port, username="limited",
                                               password="pw").set("k", "v"))
    for exc in (wrongtype, script, wrong_password, no_permission):
        assert classify(exc) is Fault.FATAL, exc
    assert classify(RuntimeError("a bug")) is Fault.FATAL
