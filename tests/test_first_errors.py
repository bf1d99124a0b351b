"""The first hour's mistakes, each answered with what is wrong and what to do: a port
that is no number, no (or a wrong) password, a worker failing at start, an integer too
wide for MessagePack, another job queue's option name, a send waiting on an outage; and
no silent wrong target (commands name the server unless given --url; ``dlq`` on a stream
that does not exist exits 1)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest
import redis
from click.testing import CliRunner

import streamwork as sw
from streamwork._cli.main import main
from streamwork._redis import connection
from streamwork._redis.server import RedisServer, free_port

PASSWORD = "first-hour-pw"


class Mailer(sw.StreamWorker):
    stream, group = "first-errors", "mailer"

    async def handle(self, msg: sw.Message) -> None:
        pass


@pytest.fixture(name="locked")
def _locked(make_server: Callable[..., RedisServer]) -> RedisServer:
    """A server that needs a password (set once it answers PING)."""
    server = make_server()
    client = redis.Redis(port=server.port)
    client.config_set("requirepass", PASSWORD)
    client.close()
    return server


def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner(env={"REDIS_URL": "", **(env or {})}).invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


# ---- a port that is no number ---------------------------------------------------------

BAD_PORT = f"redis://:{PASSWORD}@127.0.0.1:63790x/0"


def test_a_port_that_is_no_number_is_a_config_error_everywhere() -> None:
    """Producer, worker: ConfigError naming the port and the URL's form (the password
    masked), not redis-py's "Port could not be cast to integer value"."""
    for build in (lambda: sw.Producer.from_url(BAD_PORT), lambda: Mailer.from_url(BAD_PORT)):
        with pytest.raises(sw.ConfigError) as raised:
            build()
        message = str(raised.value)
        assert "'63790x'" in message and "redis://HOST:PORT/DB" in message, message
        assert PASSWORD not in message and "cast" not in message, message


@pytest.mark.parametrize("args", [["inspect"], ["run", "tests.workers.ledger:LedgerWorker"],
                                  ["send", "s", "1"], ["dlq", "list", "s"]])
def test_a_port_that_is_no_number_is_a_usage_error_in_the_cli(args: list[str]) -> None:
    code, out, err = _cli(*args, "--url", BAD_PORT)
    assert code == 2 and "not a number" in err and "Traceback" not in out + err, out + err
    assert PASSWORD not in out + err


# ---- no password, a wrong password -------------------------------------------------------

def test_no_password_says_to_put_it_in_the_url(locked: RedisServer) -> None:
    """The producer, the CLI and a worker's start answer NOAUTH / "HELLO must be called"
    with: the server needs a password, put it in the URL as redis://:PASSWORD@host."""
    with pytest.raises(sw.ConfigError) as raised, sw.Producer.from_url(locked.url) as producer:
        producer.send("first-errors", {"a": 1})
    assert "the server needs a password" in str(raised.value), raised.value
    assert isinstance(raised.value, redis.AuthenticationError)  # still what redis-py raised
    assert "redis://:PASSWORD@HOST:PORT/DB" in str(raised.value)
    assert "redis://USER:PASSWORD@HOST:PORT/DB" in str(raised.value)
    for args in (["inspect"], ["job", "s", "k"], ["dlq", "list", "s"], ["pause", "s", "--group",
                                                                      "g"]):
        code, out, err = _cli(*args, "--url", locked.url)
        assert code == 1 and "the server needs a password" in err, (args, out + err)
        assert "Traceback" not in out + err


def test_a_wrong_password_says_so(locked: RedisServer) -> None:
    url = f"redis://:not-{PASSWORD}@127.0.0.1:{locked.port}/0"
    with pytest.raises(sw.ConfigError) as raised, sw.Producer.from_url(url) as producer:
        producer.send("first-errors", {"a": 1})
    assert "refused the user name or password" in str(raised.value), raised.value
    assert PASSWORD not in str(raised.value)


def test_a_worker_failing_at_start_says_nothing_is_held(
        locked: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """WorkerFailed at start: "did not start", nothing held yet (not "held jobs stay
    pending"), the cause inline, and its traceback logged (which the message points to)."""
    caplog.set_level(logging.INFO, logger="streamwork")
    with pytest.raises(sw.WorkerFailed) as raised:
        Mailer.from_url(locked.url).run()
    message = str(raised.value)
    assert message.startswith("worker did not start: Redis refused its connection: the "
                              "server needs a password"), message
    assert "held no jobs yet" in message and "Held jobs stay pending" not in message
    assert raised.value.started is False
    logged = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
    assert logged and "did not start" in logged[0].getMessage(), caplog.records


async def test_on_start_raising_says_nothing_is_held(redis_url: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Mailer):
        async def on_start(self) -> None:
            raise LookupError("no template")

    with pytest.raises(sw.WorkerFailed) as raised:
        await Broken.from_url(redis_url).serve()
    assert "did not start" in str(raised.value) and "held no jobs yet" in str(raised.value)
    assert any(r.exc_info for r in caplog.records if r.levelno == logging.ERROR)


# ---- an integer too wide ---------------------------------------------------------------

def test_an_integer_too_wide_says_what_to_send(redis_url: str) -> None:
    with sw.Producer.from_url(redis_url) as producer:
        with pytest.raises(sw.ConfigError) as raised:
            producer.send("first-errors", {"order": 7, "amounts": [1, 2**70]})
        message = str(raised.value)
        assert "payload['amounts'][1]" in message and "does not fit in 64 bits" in message
        assert "as a string" in message and "Decimal" in message, message
        assert "can not serialize" not in message
        producer.send("first-errors", {"amounts": [2**64 - 1, -(2**63)]})  # these fit


# ---- another job queue's option name -------------------------------------------------------

@pytest.mark.parametrize(("name", "value", "use"), [
    ("retries", 3, "max_deliveries"), ("max_retries", 3, "max_deliveries"),
    ("acks_late", True, "always acknowledges a job after its handler succeeded"),
    ("prefetch", 10, "batch_size"),
    ("prefetch_count", 10, "batch_size"), ("queue", "emails", "stream"),
    ("concurency", 4, "did you mean 'concurrency'"), ("workers", 8, "concurrency"),
])
def test_another_queues_option_name_is_answered(name: str, value: object, use: str) -> None:
    """A class attribute named as a peer names the option (``retries = 3``) is refused
    with streamwork's option to use, as are from_url's keywords; a user's own object
    under such a name is not an option and is left alone."""
    worker = type("Peer", (Mailer,), {name: value})
    with pytest.raises(sw.ConfigError) as raised:
        worker.from_url("redis://127.0.0.1:6379/0")
    assert use in str(raised.value), raised.value
    with pytest.raises(sw.ConfigError) as raised:
        Mailer.from_url("redis://127.0.0.1:6379/0", **{name: value})
    assert use in str(raised.value), raised.value
    own = type("Own", (Mailer,), {name: object()})
    if not name.startswith("concurency"):
        own.from_url("redis://127.0.0.1:6379/0")


# ---- a send waiting on an outage -----------------------------------------------------

def test_a_send_waiting_on_an_outage_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    """No Redis: the send retries for retry_timeout, and says so in one WARNING (the URL
    masked) when it starts waiting, not after."""
    caplog.set_level(logging.DEBUG, logger="streamwork")
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    with sw.Producer.from_url(url, retry_timeout=0.5) as producer, \
            pytest.raises(sw.RedisUnavailable):
        producer.send("first-errors", {"a": 1})
    warned = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and r.name == "streamwork.producer"]
    assert len(warned) == 1, warned
    assert "is unavailable" in warned[0] and "retrying for up to 0.5 s" in warned[0]
    assert PASSWORD not in warned[0] and ":***@" in warned[0]


# ---- no silent wrong target ------------------------------------------------------------

def test_commands_name_the_server_and_where_its_url_came_from(
        redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """With $REDIS_URL or the default (not --url), a command names the server on stderr,
    the password masked, and says which; --json stays parseable on stdout."""
    r.xadd("named", {"x": "1"})
    code, out, err = _cli("inspect", "named", "--json", env={"REDIS_URL": redis_url})
    assert code == 0, out + err
    assert json.loads(out)["stream"] == "named"
    assert f"Redis at {redis_url} (from $REDIS_URL)" in err, err
    monkeypatch.setattr(connection, "DEFAULT_URL", redis_url)
    code, out, err = _cli("inspect", "named")
    assert code == 0 and f"Redis at {redis_url} (the default: neither --url nor $REDIS_URL " \
        "is set)" in err, out + err
    code, out, err = _cli("inspect", "named", "--url", redis_url)
    assert code == 0 and err == "", err  # typed on the command line: no doubt to clear


@pytest.mark.parametrize("args", [["list"], ["replay", "--all"], ["purge", "--yes"]])
def test_dlq_on_a_stream_that_does_not_exist_says_so(redis_url: str, args: list[str]) -> None:
    code, out, err = _cli("dlq", args[0], "no-such-stream", *args[1:], "--url", redis_url)
    assert code == 1 and "stream 'no-such-stream' does not exist" in err, out + err


def test_dlq_on_a_stream_with_dead_letters_only_still_works(redis_url: str,
                                                            r: redis.Redis) -> None:
    """A stream trimmed away whose dead letters remain is no missing stream."""
    r.xadd("{gone}:dead", {"x": "1"})
    code, out, err = _cli("dlq", "list", "gone", "--url", redis_url)
    assert code == 0, out + err
