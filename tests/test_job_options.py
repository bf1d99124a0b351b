"""Every sender takes every job option, from the one declaration (`_wire/job_options.py`).

The seven entry points (``Producer.send`` / ``send_many``, ``AsyncProducer``'s twins,
``msg.send`` / ``msg.send_many`` in a handler, ``streamwork send``) are enumerated against
`OPTIONS`: each declares every option (signatures, TypedDict keys, CLI flags), and each
actually sends a job with each option's ``example`` to a real redis-server, whose stored
body (or delayed-set entry, or priority stream) is read back. A name that is not a job
option is refused by all seven, with nothing enqueued. An option added to the declaration
is covered here without a line of this module (unless it routes the send, like
``delay``: then `_routed` must say where its jobs go).
"""

from __future__ import annotations

import datetime as dt
import inspect
import subprocess
import sys
import time
import typing
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import click
import msgpack
import pytest
import redis
import typing_extensions
from click.testing import CliRunner

import streamwork as sw
from streamwork._cli.main import main
from streamwork._cli.send import flag
from streamwork._wire.codec import BODY_FIELD, FORMAT_VERSION, Envelope, decode_body
from streamwork._wire.job_options import (
    OPTIONS,
    JobOption,
    SendManyOptions,
    SendOptions,
    check_send,
    wire_map,
)
from streamwork._wire.keys import StreamKeys
from streamwork.errors import ConfigError
from streamwork.testing import run_until_idle
from tests.conftest import ROOT

TARGET = "jo-target"
KEY = "job-1"  # differs from every example order key: an order key equal to it is not carried


# ---- the entry points ------------------------------------------------------------------------


def _many(options: dict[str, Any]) -> dict[str, Any]:
    """``send`` options as ``send_many``'s for one job."""
    by_name = {o.name: o for o in OPTIONS}
    return {by_name[n].many if n in by_name else n:
            [v] if n in by_name and by_name[n].per_job else v for n, v in options.items()}


class Relay(sw.StreamWorker):
    """Sends what each job's payload asks, with msg.send or msg.send_many; a ConfigError
    is kept (the job completes, having sent nothing)."""

    stream = "jo-source"
    group = "relay"
    read_block = 0.1
    errors: ClassVar[list[ConfigError]] = []

    async def handle(self, msg: sw.Message) -> None:
        options: dict[str, Any] = msg.payload["options"]
        try:
            if msg.payload["many"]:
                msg.send_many(TARGET, [{"n": 1}], keys=[KEY], **_many(options))
            else:
                msg.send(TARGET, {"n": 1}, key=KEY, **options)
        except ConfigError as exc:
            type(self).errors.append(exc)


async def _producer_send(url: str, r: redis.Redis, options: dict[str, Any]) -> None:
    with sw.Producer.from_url(url) as p:
        p.send(TARGET, {"n": 1}, key=KEY, **options)


async def _producer_send_many(url: str, r: redis.Redis, options: dict[str, Any]) -> None:
    with sw.Producer.from_url(url) as p:
        p.send_many(TARGET, [{"n": 1}], [KEY], **_many(options))


async def _async_send(url: str, r: redis.Redis, options: dict[str, Any]) -> None:
    async with sw.AsyncProducer.from_url(url) as p:
        await p.send(TARGET, {"n": 1}, key=KEY, **options)


async def _async_send_many(url: str, r: redis.Redis, options: dict[str, Any]) -> None:
    async with sw.AsyncProducer.from_url(url) as p:
        await p.send_many(TARGET, [{"n": 1}], [KEY], **_many(options))


async def _relay(url: str, r: redis.Redis, options: dict[str, Any], many: bool) -> None:
    Relay.errors = []
    with sw.Producer.from_url(url) as p:
        p.send(Relay.stream, {"options": options, "many": many}, key="relay-1")
    await run_until_idle(Relay.from_url(url), r)
    if Relay.errors:
        raise Relay.errors[0]


async def _message_send(url: str, r: redis.Redis, options: dict[str, Any]) -> None:
    await _relay(url, r, options, many=False)


async def _message_send_many(url: str, r: redis.Redis, options: dict[str, Any]) -> None:
    await _relay(url, r, options, many=True)


def _text(value: object) -> str:
    return value.isoformat() if isinstance(value, dt.datetime) else str(value)


async def _cli_send(url: str, r: redis.Redis, options: dict[str, Any]) -> None:
    args = ["send", TARGET, '{"n": 1}', "--key", KEY, "--url", url]
    for name, value in options.items():
        args += ["--" + name.replace("_", "-"), _text(value)]
    res = CliRunner().invoke(main, args)
    if res.exit_code != 0:
        raise ConfigError("cli", res.output)


Sender = Callable[[str, redis.Redis, dict[str, Any]], Awaitable[None]]
SENDERS: dict[str, Sender] = {
    "Producer.send": _producer_send, "Producer.send_many": _producer_send_many,
    "AsyncProducer.send": _async_send, "AsyncProducer.send_many": _async_send_many,
    "Message.send": _message_send, "Message.send_many": _message_send_many,
    "streamwork send": _cli_send,
}
METHODS: dict[str, tuple[Any, bool]] = {
    "Producer.send": (sw.Producer.send, False),
    "Producer.send_many": (sw.Producer.send_many, True),
    "AsyncProducer.send": (sw.AsyncProducer.send, False),
    "AsyncProducer.send_many": (sw.AsyncProducer.send_many, True),
    "Message.send": (sw.Message.send, False),
    "Message.send_many": (sw.Message.send_many, True),
}


# ---- what was stored ---------------------------------------------------------------------------


def _stored(r: redis.Redis, stream: str) -> list[tuple[str, Envelope, float | None]]:
    """Every job body kept for ``stream``: (where, decoded body, due score when delayed)."""
    keys = StreamKeys.for_stream(stream)
    found: list[tuple[str, Envelope, float | None]] = []
    for where in (stream, f"{keys.prefix}:p:high", f"{keys.prefix}:p:low"):
        found += [(where, decode_body(f[BODY_FIELD]), None) for _, f in r.xrange(where)]
    for member, score in r.zrange(keys.delayed, 0, -1, withscores=True):
        found.append((keys.delayed, decode_body(member.split(b":", 2)[2]), score))
    return found


def _routed(option: JobOption, where: str, score: float | None, sent_ms: float) -> None:
    """Where a job sent with a routing option (no wire field) went, by option."""
    delayed = StreamKeys.for_stream(TARGET).delayed
    if option.name == "delay":
        assert where == delayed and score is not None
        assert abs(score - (sent_ms + 30_000)) < 20_000, score  # due 30 s after sending
    elif option.name == "at":
        assert isinstance(option.example, dt.datetime)
        assert (where, score) == (delayed, option.example.timestamp() * 1000)
    else:
        pytest.fail(f"job option {option.name!r} only routes the send: say here where its "
                    "jobs go")


# ---- the tests ---------------------------------------------------------------------------------


def test_the_declaration_is_the_typed_dicts() -> None:
    """SendOptions and SendManyOptions declare exactly the options (one line each)."""
    assert set(typing.get_type_hints(SendOptions)) == {o.name for o in OPTIONS}
    assert set(typing.get_type_hints(SendManyOptions)) == {o.many for o in OPTIONS}
    assert {o.name: o.per_job for o in OPTIONS}["order_key"]


@pytest.mark.parametrize("entry", sorted(METHODS))
def test_every_sender_declares_every_option(entry: str) -> None:
    """Each Python sender types its job options as ``**options: Unpack[...]`` of the
    TypedDict made from the declaration."""
    method, many = METHODS[entry]
    hints = typing.get_type_hints(method, include_extras=True)
    assert typing_extensions.get_origin(hints["options"]) is typing_extensions.Unpack
    [typed] = typing_extensions.get_args(hints["options"])
    assert typed is (SendManyOptions if many else SendOptions)
    kinds = {p.name: p.kind for p in inspect.signature(method).parameters.values()}
    assert kinds["options"] is inspect.Parameter.VAR_KEYWORD


def test_the_command_has_a_flag_per_option() -> None:
    """``streamwork send`` has ``--name`` for every option, with the option's help."""
    params = {p.name: p for p in main.commands["send"].params}
    for option in OPTIONS:
        param = params[option.name]
        assert flag(option) in param.opts
        assert isinstance(param, click.Option) and param.help == option.help


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
@pytest.mark.parametrize("entry", list(SENDERS))
async def test_every_sender_sends_every_option(redis_url: str, r: redis.Redis, entry: str,
                                               option: JobOption) -> None:
    """A job sent with the option's example through ``entry`` is stored with it: in the
    body's options map (and decoded back by name), or routed where the option says."""
    sent_ms = time.time() * 1000
    await SENDERS[entry](redis_url, r, {option.name: option.example})
    [(where, env, score)] = _stored(r, TARGET)
    assert env.key == KEY and env.payload == {"n": 1}
    if option.wire is None:
        _routed(option, where, score, sent_ms)
        assert env.options == {}
        return
    assert env.options == {option.name: option.read(option.check(option.example))}
    raw = msgpack.unpackb(
        next(f[BODY_FIELD] for _, f in r.xrange(where)), timestamp=3)
    assert raw["v"] == FORMAT_VERSION and raw["o"] == {option.wire: option.check(option.example)}
    if option.name == "priority":
        assert where == f"{StreamKeys.for_stream(TARGET).prefix}:p:high"


@pytest.mark.parametrize("entry", list(SENDERS))
async def test_an_unknown_option_is_refused_with_nothing_enqueued(
        redis_url: str, r: redis.Redis, entry: str) -> None:
    """``retries=3`` is no job option: every sender refuses it, saying so and naming the
    job options; nothing reaches Redis for the target."""
    with pytest.raises(ConfigError) as info:
        await SENDERS[entry](redis_url, r, {"retries": 3})
    text = str(info.value)
    assert "retries" in text and ("is not a job option" in text or "No such option" in text)
    if entry != "streamwork send":  # click refuses an unknown flag itself, listing its own
        assert all(o.name in text or o.many in text for o in OPTIONS), text
    assert _stored(r, TARGET) == []
    assert not [k for k in r.keys("*") if TARGET.encode() in k]


@pytest.mark.parametrize("entry", [e for e in SENDERS if e != "streamwork send"])
async def test_a_misspelt_option_gets_a_did_you_mean(redis_url: str, r: redis.Redis,
                                                    entry: str) -> None:
    """``timout=5`` is refused with "did you mean 'timeout'?"."""
    with pytest.raises(ConfigError, match="did you mean 'timeout'"):
        await SENDERS[entry](redis_url, r, {"timout": 5})
    assert _stored(r, TARGET) == []


def test_send_many_names_the_per_job_keyword(redis_url: str) -> None:
    """send_many takes a per-job option as a list under its plural, and says so."""
    with sw.Producer.from_url(redis_url) as p:
        with pytest.raises(ConfigError, match="did you mean 'order_keys'"):
            p.send_many(TARGET, [{}], order_key="c")  # type: ignore[call-arg]
        with pytest.raises(ConfigError, match="one order_key per job"):
            p.send_many(TARGET, [{}], order_keys="c")
        with pytest.raises(ConfigError, match="2 values for 1 jobs"):
            p.send_many(TARGET, [{}], order_keys=["a", "b"])


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_none_means_not_given(redis_url: str, r: redis.Redis, option: JobOption) -> None:
    """An option given as None is not given: the body carries no options map."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(TARGET, {"n": 1}, key=KEY, **{option.name: None})  # type: ignore[misc]
    [(where, env, _)] = _stored(r, TARGET)
    assert (where, env.options) == (TARGET, {})
    assert b"\xa1o" not in r.xrange(TARGET)[0][1][BODY_FIELD]


def test_defaults_are_not_carried() -> None:
    """An order key equal to the job's key and the normal priority are not carried."""
    assert wire_map(check_send({"order_key": KEY, "priority": "normal"}), KEY) == {}
    assert wire_map(check_send({"order_key": "c", "timeout": 0.0004}), KEY) == {"ok": "c",
                                                                                "l": 1}


@pytest.mark.parametrize(("name", "bad", "says"), [
    ("timeout", 0, "seconds > 0"), ("timeout", float("inf"), "seconds > 0"),
    ("timeout", "5", "seconds > 0"), ("order_key", "", "non-empty str"),
    ("priority", "urgent", "'high', 'normal', 'low'"), ("delay", -1, "seconds >= 0"),
    ("at", dt.datetime(2030, 1, 1), "timezone-aware"),
])
def test_a_bad_value_names_the_option_and_what_it_takes(name: str, bad: object,
                                                        says: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_send({name: bad})
    assert info.value.option == name and says in str(info.value)


@pytest.mark.parametrize(("path", "ok"), [("send_options_ok.py", True),
                                          ("send_options_bad.py", False)])
def test_the_options_are_typed_for_mypy(path: str, ok: bool) -> None:
    """mypy --strict accepts every sender called with the options' types and rejects a
    wrong type and an unknown name."""
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                          str(ROOT / "tests" / "typecheck" / path)], capture_output=True,
                         text=True, cwd=ROOT, timeout=170, check=False)
    if ok:
        assert out.returncode == 0, out.stdout + out.stderr
    else:
        assert out.returncode == 1, out.stdout + out.stderr
        assert 'Argument "timeout" to "send" of "Producer" has incompatible type "str"' \
            in out.stdout, out.stdout
        assert 'Unexpected keyword argument "retries"' in out.stdout, out.stdout
        assert ':11: error: List item 0 has incompatible type "int"; expected "str"' \
            in out.stdout, out.stdout
