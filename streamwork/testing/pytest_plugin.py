"""The pytest plugin of streamwork (registered by its ``pytest11`` entry point: installing
streamwork is enough): a private Redis for the test session, emptied before each test, and
a worker run until its stream is drained.

Fixtures:

* ``streamwork_redis_url`` (session): the session's server: the database given by
  ``--streamwork-redis-url URL`` (or the ``streamwork_redis_url`` ini option); else a
  ``redis-server`` started on a free loopback port (``$STREAMWORK_REDIS_SERVER``, else
  ``redis-server`` on PATH, else the ``embedded`` extra's Valkey) and ended with the
  session; else ``$REDIS_URL``. A database given is used only if it is empty when the
  session starts (the fixtures empty it before each test: one holding data is refused,
  never emptied);
* ``streamwork_url``: that URL, the database emptied before the test;
* ``streamwork_client``: a sync ``redis.Redis`` on it;
* ``streamwork_producer``: a `Producer` on it;
* ``streamwork_run``: a `WorkerRunner` on it: ``streamwork_run(Emails)`` serves an
  ``Emails`` worker until nothing is left to run and returns a `WorkerRun`.

Without any server the tests using them are skipped (failed when ``$CI`` is set).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

from streamwork._producer.shells import Producer
from streamwork._redis.server import RedisServer, find_server_binary
from streamwork._text import redact_url
from streamwork.errors import StreamworkError
from streamwork.testing.runs import WorkerRunner

__all__ = ["streamwork_client", "streamwork_producer", "streamwork_redis_url",
           "streamwork_run", "streamwork_url"]

#: how the session's server is emptied before each test: "all" (a private one, whole) or
#: "db" (``$REDIS_URL``: only its database)
_STASH = pytest.StashKey[str]()


def _no_server(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"streamwork fixtures: no Redis server: {why}")
    pytest.skip(f"streamwork fixtures: no Redis server: {why}")


def _checked_url(url: str, origin: str) -> str:
    """``url`` (given by ``origin``) if it answers and its database is empty; else fail
    saying why."""
    shown = redact_url(url)
    try:
        client = redis.Redis.from_url(url)
        try:
            held = int(client.dbsize())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError) as exc:
        pytest.fail(f"streamwork fixtures: {origin} {shown} does not answer "
                    f"({type(exc).__name__}: {exc}): start that server or fix the URL",
                    pytrace=False)
    if held:
        pytest.fail(f"streamwork fixtures: {origin} {shown} holds {held:,} keys; the "
                    "fixtures empty the database before each test, so they use only an "
                    "empty one: give a database kept for tests (another db number, say), "
                    "or install redis-server (or streamwork[embedded]) for a private "
                    "server", pytrace=False)
    return url


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--streamwork-redis-url", default=None, metavar="URL",
                     help="streamwork fixtures: use this (empty) Redis database instead of "
                          "starting a private server; it is emptied before each test")
    parser.addini("streamwork_redis_url", default=None,
                  help="streamwork fixtures: as --streamwork-redis-url")


@pytest.fixture(scope="session")
def streamwork_redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of the session's Redis (see the module's docstring); not emptied here."""
    config = request.config
    given = config.getoption("--streamwork-redis-url") or config.getini("streamwork_redis_url")
    if given:
        config.stash[_STASH] = "db"
        yield _checked_url(str(given), "--streamwork-redis-url")
        return
    try:
        find_server_binary()
    except StreamworkError as exc:
        if os.environ.get("STREAMWORK_REDIS_SERVER"):  # asked for, and wrong: say so
            pytest.fail(f"streamwork fixtures: {exc}", pytrace=False)
        url = os.environ.get("REDIS_URL")
        if not url:
            _no_server(f"{exc}; or set REDIS_URL to an empty database")
            return
        config.stash[_STASH] = "db"
        yield _checked_url(url, "$REDIS_URL")
        return
    config.stash[_STASH] = "all"
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def streamwork_url(streamwork_redis_url: str, request: pytest.FixtureRequest) -> str:
    """The session's Redis, emptied before this test."""
    client = redis.Redis.from_url(streamwork_redis_url)
    try:
        if request.config.stash.get(_STASH, "db") == "all":
            client.flushall()
        else:
            client.flushdb()
    finally:
        client.close()
    return streamwork_redis_url


@pytest.fixture
def streamwork_client(streamwork_url: str) -> Iterator[redis.Redis]:
    """A sync client (bytes replies) on the emptied Redis; closed after the test."""
    client = redis.Redis.from_url(streamwork_url)
    yield client
    client.close()


@pytest.fixture
def streamwork_producer(streamwork_url: str) -> Iterator[Producer]:
    """A `Producer` on the emptied Redis; closed after the test."""
    with Producer.from_url(streamwork_url) as producer:
        yield producer


@pytest.fixture
def streamwork_run(streamwork_url: str, streamwork_client: redis.Redis) -> WorkerRunner:
    """``streamwork_run(WorkerClass, timeout=30.0, **options)``: serve a worker on the
    emptied Redis until its group has read and acknowledged everything and nothing is
    delayed or waiting for a retry, stop it and return a `WorkerRun` (``.counts``,
    ``.status(key)``); ``await streamwork_run.run_async(...)`` in an async test."""
    return WorkerRunner(streamwork_url, streamwork_client)
