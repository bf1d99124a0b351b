"""The pytest plugin (``streamwork.testing.pytest_plugin``, registered by the package's
``pytest11`` entry point) in a user's project: pytester writes a project with tests that
use the fixtures and runs pytest on it in a subprocess, as a user would."""

from __future__ import annotations

import os

import pytest
import redis

from streamwork.testing import RedisServer

pytest_plugins = ["pytester"]

WORKER = '''
import streamwork as sw


class Emails(sw.StreamWorker):
    stream = "emails"
    group = "mailer"
    read_block = 0.05
    retry_delay = 0.05

    async def handle(self, msg: sw.Message) -> str:
        if "@" not in msg.payload["to"]:
            raise sw.DeadLetter("no such recipient")
        if msg.payload.get("flaky") and msg.attempt == 1:
            raise RuntimeError("the mail server hung up")
        msg.send("audit", {"mailed": msg.payload["to"]})
        return f"mailed {msg.payload['to']}"
'''

TESTS = '''
import pytest
import redis

from streamwork.testing import WorkerRun, message
from workers import Emails


def test_a_run_until_idle(streamwork_producer, streamwork_run, streamwork_client):
    streamwork_producer.send("emails", {"to": "ada@example.com"}, key="ada")
    streamwork_producer.send("emails", {"to": "kim@example.com", "flaky": True}, key="kim")
    streamwork_producer.send("emails", {"to": "nobody"}, key="nobody")
    run = streamwork_run(Emails)
    assert isinstance(run, WorkerRun)
    assert (run.counts["acked"], run.counts["retried"], run.counts["dead_lettered"]) == (
        2, 1, 1)
    assert run.status("ada").result == "mailed ada@example.com"
    assert run.status("kim").attempts == 2
    assert run.status("nobody").state == "dead"
    assert streamwork_client.xlen("audit") == 2


def test_each_test_starts_empty(streamwork_client, streamwork_url):
    assert streamwork_client.dbsize() == 0
    assert streamwork_url.startswith("redis://127.0.0.1:")
    streamwork_client.set("left-behind", 1)


def test_still_empty(streamwork_client):
    assert streamwork_client.dbsize() == 0


@pytest.mark.asyncio
async def test_from_an_async_test(streamwork_producer, streamwork_run):
    streamwork_producer.send("emails", {"to": "ada@example.com"}, key="ada")
    assert (await streamwork_run.run_async(Emails)).counts["acked"] == 1
    streamwork_producer.send("emails", {"to": "kim@example.com"}, key="kim")
    assert streamwork_run(Emails, concurrency=2).counts["acked"] == 1


def test_a_handler_alone():
    msg = message({"to": "ada@example.com"}, key="ada", stream="emails", group="mailer")
    import asyncio
    assert asyncio.run(Emails.from_url("redis://127.0.0.1:1/0").handle(msg)) == (
        "mailed ada@example.com")
    [sent] = msg.sent
    assert (sent.stream, sent.payload) == ("audit", {"mailed": "ada@example.com"})
'''


def project(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(workers=WORKER, test_mail=TESTS)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly",
                                         *args, timeout=240)


def test_the_fixtures_in_a_users_project(pytester: pytest.Pytester,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A project with nothing but streamwork installed gets the fixtures: a private server
    for the session, emptied before each test, a worker run until idle with what it did,
    from plain and async tests, and ``message()`` for a handler alone."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    project(pytester)
    result = run(pytester)
    result.assert_outcomes(passed=5)


def test_a_given_database_is_used_only_when_empty(pytester: pytest.Pytester) -> None:
    """``--streamwork-redis-url`` points the fixtures at a server of one's own: used (and
    emptied before each test) when its database is empty; one holding data is refused
    with what to do, and left as it was."""
    project(pytester)
    with RedisServer() as server:
        result = run(pytester, f"--streamwork-redis-url={server.url}")
        result.assert_outcomes(passed=5)
        client = redis.Redis.from_url(server.url)
        try:
            client.flushall()  # what the run left
            client.set("precious", 1)
            refused = run(pytester, f"--streamwork-redis-url={server.url}",
                          "-k", "still_empty")
            refused.assert_outcomes(errors=1)
            refused.stdout.fnmatch_lines(["*holds 1 keys*kept for tests*"])
            assert client.get("precious") == b"1"
        finally:
            client.close()


def test_a_wrong_server_binary_is_an_error_not_a_skip(pytester: pytest.Pytester,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``$STREAMWORK_REDIS_SERVER`` naming no executable fails the tests that need a
    server, saying so; a test that needs none still passes."""
    project(pytester)
    monkeypatch.setenv("STREAMWORK_REDIS_SERVER", os.path.join(
        str(pytester.path), "no-such-server"))
    result = run(pytester, "-k", "still_empty or handler_alone")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*STREAMWORK_REDIS_SERVER*is not an executable*"])
