"""Start-up mistakes are refused with a message saying what to fix, not passed silently: a
worker class without ``handle``, a misspelt option attribute, a ``streamwork run`` target
that does not exist or does not import, a consumer group the stream does not have, and a
job key that is not UTF-8 text (blamed on the key, not on the payload)."""

from __future__ import annotations

import functools
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

import streamwork as sw
from streamwork._cli.main import main
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names
from streamwork.errors import ConfigError, GroupNotFound

DEAD_URL = "redis://127.0.0.1:1/0"  # never contacted: building a worker must not connect
S = "startup-orders"
BAD_KEY = "order-\ud800-7"  # a lone surrogate: what surrogateescape leaves of a bad byte


# -- a worker class without handle ---------------------------------------------------


class NoHandle(sw.StreamWorker):
    stream, group = "orders", "billing"


class Base(sw.StreamWorker):
    """A shared base without handle: fine to declare, its subclasses define handle."""

    stream, group = "orders", "billing"
    concurrency = 4


class WithHandle(Base):
    async def handle(self, msg: sw.Message) -> None:
        pass


def test_a_worker_class_without_handle_is_refused_when_built() -> None:
    """from_url and the constructor raise ConfigError naming handle and saying what to
    write; a base class without handle may still be declared and subclassed."""
    for build in (NoHandle.from_url, NoHandle):
        with pytest.raises(ConfigError) as info:
            build(DEAD_URL)
        assert info.value.option == "handle"
        assert "NoHandle does not define handle()" in str(info.value)
        assert "async def handle(self, msg)" in str(info.value)
    assert WithHandle.from_url(DEAD_URL).config.concurrency == 4


# -- misspelt option attributes ------------------------------------------------------


@pytest.mark.parametrize(("typo", "option"), [
    ("visiblity_timeout", "visibility_timeout"), ("concurency", "concurrency"),
    ("dedupe", "dedup"), ("max_delivery", "max_deliveries"), ("partition", "partitions"),
    ("payload_typ", "payload_type"), ("schedule", "schedules"), ("catchup", "catch_up"),
])
def test_a_misspelt_option_attribute_is_refused_with_a_suggestion(typo: str,
                                                                  option: str) -> None:
    """A class attribute a letter or two away from an option's name raises ConfigError
    naming it and the option meant, as the same typo given to from_url does."""
    worker_cls: type[WithHandle] = type("Typo", (WithHandle,), {typo: 5})
    with pytest.raises(ConfigError) as info:
        worker_cls.from_url(DEAD_URL)
    assert info.value.option == typo
    assert f"did you mean {option!r}?" in str(info.value)
    with pytest.raises(ConfigError) as kwarg:  # the keyword form says the same
        WithHandle.from_url(DEAD_URL, **{typo: 5})
    assert kwarg.value.option == typo


def test_a_misspelt_option_in_a_mixin_is_refused_too() -> None:
    """The check covers the worker's own bases (a mixin of shared settings), not only the
    class named."""
    class Settings:
        visiblity_timeout = 5.0

    class Mixed(Settings, WithHandle):
        pass

    with pytest.raises(ConfigError, match="did you mean 'visibility_timeout'"):
        Mixed(DEAD_URL)


class Busy(sw.StreamWorker):
    """A worker with the attributes and methods real workers have: none is an option."""

    stream, group = "orders", "billing"
    visibility_timeout = 5.0  # a real option
    db: Any = None
    client: Any = None
    session: Any = None
    pool: Any = None
    timeout_handler: Any = None
    retries_seen = 0
    batch = 10
    payload = "x"
    cache: dict[str, int] = {}
    _visiblity_timeout = 1.0  # private: the user's own
    _concurency = 2

    async def handle(self, msg: sw.Message) -> None:
        pass

    def concurency(self) -> int:  # a method, whatever its name
        return 1

    @staticmethod
    def dedupe(x: int) -> int:
        return x

    @classmethod
    def streams(cls) -> list[str]:
        return [cls.stream]

    @property
    def groups(self) -> list[str]:
        return [self.group]

    @functools.cached_property
    def timeouts(self) -> float:
        return 1.0

    async def on_start(self) -> None:  # StreamWorker's own names
        pass


def test_user_attributes_and_methods_are_not_taken_for_typos() -> None:
    """Attributes far from every option name, private names, methods, properties and
    StreamWorker's own names build without complaint."""
    worker = Busy.from_url(DEAD_URL)
    assert worker.config.visibility_timeout == 5.0


# -- streamwork run MODULE:Name ------------------------------------------------------


@pytest.fixture(name="app")
def _app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package of worker modules in a fresh directory made the current one (as for
    `streamwork run`); its name is unique, and it is forgotten afterwards."""
    name = f"swapp_{uuid.uuid4().hex[:8]}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "workers.py").write_text(textwrap.dedent("""
        import streamwork as sw

        class Payments(sw.StreamWorker):
            stream, group = "payments", "billing"
            async def handle(self, msg):
                pass

        class Refunds(sw.StreamWorker):
            stream, group = "refunds", "billing"
            async def handle(self, msg):
                pass

        PAYMENTS_STREAM = "payments"
    """))
    (pkg / "broken.py").write_text("import streamwork as sw\n\nrate = undefined_name * 2\n")
    (pkg / "needs_dep.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_worker puts the cwd in front
    yield name
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def run_target(target: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", target, "--url", DEAD_URL])
    return result.exit_code, result.output


def test_run_names_a_missing_worker_and_lists_the_modules_workers(app: str) -> None:
    """`run pkg.workers:Payment` with no such name says so, suggests the near one and
    lists the module's StreamWorker subclasses, instead of "is not a StreamWorker
    subclass"; a name that is there but no worker says what it is."""
    code, out = run_target(f"{app}.workers:Payment")
    assert code == 1
    assert f"there is no 'Payment' in '{app}.workers'" in out
    assert "Did you mean 'Payments'?" in out
    assert "Payments, Refunds" in out
    assert "is not a StreamWorker subclass" not in out
    code, out = run_target(f"{app}.workers:PAYMENTS_STREAM")
    assert code == 1
    assert "is a str, not a StreamWorker subclass" in out and "Payments, Refunds" in out


def test_run_says_a_module_that_fails_to_import_did(app: str) -> None:
    """A module that raises on import is reported as such, with its error and where it
    was raised (not a bare traceback, not "cannot import"); one that is not there is
    reported as not found."""
    code, out = run_target(f"{app}.broken:Worker")
    assert code == 1
    assert f"module '{app}.broken' was found, but importing it failed" in out
    assert "NameError: name 'undefined_name' is not defined" in out
    assert "broken.py\", line 3" in out and "Traceback" not in out
    code, out = run_target(f"{app}.needs_dep:Worker")
    assert code == 1
    assert f"module '{app}.needs_dep' was found, but importing it failed" in out
    assert "No module named 'no_such_dependency_xyz'" in out
    code, out = run_target(f"{app}.nothere:Worker")
    assert code == 1
    assert f"no module named '{app}.nothere'" in out


# -- a group the stream does not have ------------------------------------------------


def job_records(r: redis.Redis) -> list[bytes]:
    return sorted(r.scan_iter(match=StreamKeys.for_stream(S).prefix + ":job:*"))


def xinfo_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_xinfo|groups", {}).get("calls", 0))


def test_status_result_cancel_refuse_a_group_the_stream_lacks(redis_url: str,
                                                              r: redis.Redis) -> None:
    """With a group that does not exist on the stream (which has others), status, result
    and cancel raise GroupNotFound naming the groups there are; cancel writes nothing. A
    stream no worker has joined yet still answers (jobs may be awaited or cancelled before
    the workers start)."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(S, {}, key="k1")
        assert p.status(S, "k1", group="billing").state == "unknown"  # no group yet
        r.xgroup_create(S, "billing", id="0")
        r.xgroup_create(S, "mailer", id="0")
        for call in (lambda: p.status(S, "k1", group="biling"),
                     lambda: p.result(S, "k1", group="biling", timeout=60),
                     lambda: p.cancel(S, "k1", group="biling")):
            with pytest.raises(GroupNotFound) as info:
                call()
            assert isinstance(info.value, sw.StreamworkError)
            assert info.value.groups == ["billing", "mailer"]
            assert "no consumer group 'biling'" in str(info.value)
            assert "'billing', 'mailer'" in str(info.value)
        assert job_records(r) == []  # the cancel of the typo recorded nothing
        assert p.status(S, "k1", group="billing").state == "unknown"
        assert p.cancel(S, "k1", group="billing") == "unknown"
        assert p.status(S, "k1", group="billing").state == "cancelled"


def test_status_with_a_group_stays_one_get_when_the_record_is_there(
        redis_url: str, r: redis.Redis) -> None:
    """The group is checked only when no record is found, and once per producer: a found
    record costs one GET, as before."""
    r.xgroup_create(S, "billing", id="0", mkstream=True)
    with sw.Producer.from_url(redis_url) as p:
        p.cancel(S, "k1", group="billing")  # a record to find
        before = xinfo_calls(r)
        for _ in range(3):
            assert p.status(S, "k1", group="billing").state == "cancelled"
        assert xinfo_calls(r) == before
    with sw.Producer.from_url(redis_url) as p:
        before = xinfo_calls(r)
        for _ in range(3):
            assert p.status(S, "no-record", group="billing").state == "unknown"
        assert xinfo_calls(r) == before + 1  # checked once, then known


async def test_async_producer_refuses_a_group_the_stream_lacks(redis_url: str,
                                                               r: redis.Redis) -> None:
    """AsyncProducer's status, result and cancel raise GroupNotFound as Producer's do."""
    r.xgroup_create(S, "billing", id="0", mkstream=True)
    async with sw.AsyncProducer.from_url(redis_url) as p:
        await p.send(S, {}, key="k1")
        for call in (lambda: p.status(S, "k1", group="typo"),
                     lambda: p.result(S, "k1", group="typo", timeout=60),
                     lambda: p.cancel(S, "k1", group="typo")):
            with pytest.raises(GroupNotFound, match="its groups are 'billing'"):
                await call()
        assert job_records(r) == []
        assert (await p.status(S, "k1", group="billing")).state == "unknown"


def test_a_partitioned_stream_refuses_a_group_no_partition_has(redis_url: str,
                                                               r: redis.Redis) -> None:
    """On a partitioned stream a group is known when any partition has it (workers of a
    subset of partitions); one that none has raises GroupNotFound."""
    names = partition_names(S, 4)
    with sw.Producer.from_url(redis_url, partitions=4) as p:
        p.send_many(S, [{}] * 8, keys=[f"k{i}" for i in range(8)])
        r.xgroup_create(names[2], "billing", id="0")
        assert p.status(S, "k1", group="billing").state == "unknown"
        with pytest.raises(GroupNotFound, match="its groups are 'billing'"):
            p.status(S, "k1", group="biling")
        with pytest.raises(GroupNotFound):
            p.cancel(S, "k1", group="biling")
        assert job_records(r) == []


# -- a job key that is not UTF-8 text ------------------------------------------------


def blamed_on(option: str, info: pytest.ExceptionInfo[ConfigError], what: str = "") -> None:
    assert info.value.option == option, what
    assert "valid UTF-8 text" in str(info.value), what
    assert "payload" not in str(info.value), what


async def test_a_key_that_is_not_utf8_is_blamed_on_the_key(redis_url: str,
                                                           r: redis.Redis) -> None:
    """A lone surrogate in a job key (or order key) raises ConfigError naming the key and
    saying keys must be valid UTF-8 text, from every producer method, before anything is
    sent; not "a payload that cannot be encoded", not a bare UnicodeEncodeError."""
    r.xgroup_create(S, "billing", id="0", mkstream=True)
    with sw.Producer.from_url(redis_url) as p, \
            sw.Producer.from_url(redis_url, partitions={"startup-split": 4}) as split:
        calls: dict[str, Callable[[], Any]] = {
            "send": lambda: p.send(S, {"a": 1}, key=BAD_KEY),
            "send delayed": lambda: p.send(S, {"a": 1}, key=BAD_KEY, delay=60),
            "send_many": lambda: p.send_many(S, [{}, {}], keys=["ok", BAD_KEY]),
            "send partitioned": lambda: split.send("startup-split", {}, key=BAD_KEY),
            "status": lambda: p.status(S, BAD_KEY, group="billing"),
            "result": lambda: p.result(S, BAD_KEY, group="billing", timeout=60),
            "cancel": lambda: p.cancel(S, BAD_KEY, group="billing"),
        }
        for what, call in calls.items():
            with pytest.raises(ConfigError) as info:
                call()
            blamed_on("key", info, what)
        with pytest.raises(ConfigError) as info:
            p.send(S, {}, key="k", order_key="acct-\udcff")
        blamed_on("order_key", info)
        with pytest.raises(ConfigError) as info:
            p.send_many(S, [{}], keys=["k"], order_keys=["acct-\udcff"])
        blamed_on("order_key", info)
    async with sw.AsyncProducer.from_url(redis_url) as ap:
        with pytest.raises(ConfigError) as info:
            await ap.send(S, {}, key=BAD_KEY)
        blamed_on("key", info)
        with pytest.raises(ConfigError) as info:
            await ap.status(S, BAD_KEY, group="billing")
        blamed_on("key", info)
    assert r.xlen(S) == 0 and job_records(r) == []
    assert not r.exists(StreamKeys.for_stream(S).delayed)
