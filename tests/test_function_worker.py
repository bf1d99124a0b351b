"""``@sw.worker``: a worker made of one function. The decorated name is a StreamWorker
subclass named after the function; its options are those of the class API, checked when
the decorator runs; it runs in-process, under `streamwork run module:function` (also with
--processes and next to other workers), and mypy sees its payload type."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

import streamwork as sw
from streamwork._cli.main import main
from streamwork._ops.deadletter import list_dead
from streamwork._worker.config import WorkerConfig, option_types
from streamwork._worker.function import KEYWORDS, FunctionWorker, WorkerKeywords
from streamwork.testing import await_for, run_until_idle, wait_for
from tests.workers import function as workers_function

ROOT = Path(__file__).resolve().parent.parent
S, G = "fn-jobs", "fn-group"
#: options that make the in-process workers quick to read and to retry
QUICK: dict[str, Any] = {"read_block": 0.05, "retry_delay": 0.01, "retry_max_delay": 0.05}


@dataclasses.dataclass
class Invoice:
    order_id: int
    amount_cents: int


def send(url: str, jobs: dict[str, Any], stream: str = S) -> None:
    with sw.Producer.from_url(url) as p:
        for key, payload in jobs.items():
            p.send(stream, payload, key=key)


def results(url: str, keys: list[str], stream: str = S, group: str = G) -> list[Any]:
    with sw.Producer.from_url(url) as p:
        return [p.result(stream, k, group=group, timeout=60) for k in keys]


# -- the class it makes ---------------------------------------------------------------


@sw.worker(S, group=G, concurrency=4, **QUICK)
async def bill(msg: sw.Message) -> int:
    """Bill one order."""
    return int(msg.payload["cents"]) * 2


def test_the_decorated_name_is_a_worker_class_named_after_the_function() -> None:
    """The decorated name is a StreamWorker subclass carrying the function's name,
    qualified name, module and docstring (what `streamwork run` and the logs use), with
    the options as class attributes; the function stays callable as ``.fn``."""
    assert isinstance(bill, type) and issubclass(bill, sw.StreamWorker)
    assert issubclass(bill, FunctionWorker)
    assert (bill.__name__, bill.__qualname__, bill.__module__) == (
        "bill", "bill", __name__)
    assert bill.__doc__ == "Bill one order."
    assert (bill.stream, bill.group, bill.concurrency) == (S, G, 4)
    msg = sw.Message(id="1-0", stream=S, key="k", payload={"cents": 21}, attempt=1,
                     enqueued_at=0.0, headers={})
    assert asyncio.run(bill.fn(msg)) == 42
    w = bill.from_url("redis://127.0.0.1:1/0")
    assert w.worker_name == f"{__name__}.bill"
    assert repr(w).startswith("<bill stream='fn-jobs'")
    assert asyncio.run(w.fn(msg)) == 42  # an instance has it too, unbound


def test_from_url_overrides_what_the_decorator_set() -> None:
    """Options given to the decorator are defaults, as class attributes are: from_url
    (and so `streamwork run --option`) overrides them."""
    assert bill.from_url("redis://127.0.0.1:1/0").config.concurrency == 4
    assert bill.from_url("redis://127.0.0.1:1/0", concurrency=2).config.concurrency == 2


def test_keywords_are_every_option_of_the_class_api() -> None:
    """The decorator takes every worker option (WorkerOptions' fields but stream and
    group, which it takes first), the class-only ones and the hooks; its typed keywords
    (for mypy) are exactly these, with the options' own types (a list may be any
    sequence)."""
    options = [n for n in WorkerConfig.option_names() if n not in ("stream", "group")]
    assert set(KEYWORDS) == {*options, "local_cache", "concurrency_key", "schedules",
                             "codec", "middleware", "on_start", "on_stop"}
    assert set(WorkerKeywords.__optional_keys__) == set(KEYWORDS)
    hints = typing.get_type_hints(WorkerKeywords)
    for name in options:
        declared = str(option_types()[name]).replace("tuple[", "Sequence[").replace(
            ", ...]", "]")
        assert str(hints[name]).replace("collections.abc.", "") == declared, name


# -- running jobs ---------------------------------------------------------------------


async def test_an_async_function_runs_jobs_and_returns_results(redis_url: str,
                                                               r: redis.Redis) -> None:
    """An ``async def`` runs each job on the worker's loop; what it returns is the job's
    result (``p.result``)."""
    send(redis_url, {f"o{i}": {"cents": i} for i in range(5)})
    await run_until_idle(bill.from_url(redis_url), r, timeout=60)
    assert results(redis_url, [f"o{i}" for i in range(5)]) == [0, 2, 4, 6, 8]


async def test_a_plain_def_runs_in_the_thread_pool(redis_url: str, r: redis.Redis) -> None:
    """A plain ``def`` runs in the worker's thread pool (not on the loop), its return
    value the job's result."""
    threads: set[str] = set()

    @sw.worker(S, group=G, **QUICK)
    def shout(msg: sw.Message) -> str:
        threads.add(threading.current_thread().name)
        return str(msg.payload).upper()

    send(redis_url, {"a": "hello", "b": "there"})
    await run_until_idle(shout.from_url(redis_url), r, timeout=60)
    assert results(redis_url, ["a", "b"]) == ["HELLO", "THERE"]
    assert threads and threading.main_thread().name not in threads


async def test_concurrency_is_applied(redis_url: str, r: redis.Redis) -> None:
    """``concurrency=3``: never more than three jobs in flight, and three at once when
    there are more jobs than that (each waits until three ran together)."""
    running = peak = 0

    @sw.worker(S, group=G, concurrency=3, **QUICK)
    async def slow(msg: sw.Message) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await await_for(lambda: peak >= 3, 30, message="three jobs in flight")
        finally:
            running -= 1

    send(redis_url, {f"j{i}": i for i in range(9)})
    w = slow.from_url(redis_url)
    assert w.config.concurrency == 3
    await run_until_idle(w, r, timeout=60)
    assert w.counts["acked"] == 9
    assert peak == 3


async def test_max_deliveries_dead_letters_a_failing_function(redis_url: str,
                                                               r: redis.Redis) -> None:
    """``max_deliveries=2`` with a function that always raises: two attempts, then the
    job is dead-lettered with the function's error; ``p.result`` raises JobFailed."""
    attempts: list[int] = []

    @sw.worker(S, group=G, max_deliveries=2, **QUICK)
    def declines(msg: sw.Message) -> None:
        attempts.append(msg.attempt)
        raise RuntimeError("card declined")

    send(redis_url, {"order-1": {"cents": 5}})
    w = declines.from_url(redis_url)
    await run_until_idle(w, r, timeout=60)
    assert attempts == [1, 2]
    assert w.counts["dead_lettered"] == 1
    [dead] = list_dead(r, S, 10)
    assert (dead.key, dead.attempts) == ("order-1", 2)
    assert "card declined" in dead.detail
    with sw.Producer.from_url(redis_url) as p, pytest.raises(sw.JobFailed):
        p.result(S, "order-1", group=G, timeout=30)


async def test_a_typed_payload_arrives_as_its_type(redis_url: str, r: redis.Redis) -> None:
    """``payload_type=Invoice``: the function gets an Invoice; a payload that does not
    validate is dead-lettered (payload:invalid) without running it."""
    got: list[Any] = []

    @sw.worker(S, group=G, payload_type=Invoice, **QUICK)
    async def charge(msg: sw.Message[Invoice]) -> int:
        got.append(msg.payload)
        return msg.payload.amount_cents

    send(redis_url, {"inv-1": Invoice(1, 250), "bad": {"order_id": "two"}})
    w = charge.from_url(redis_url)
    await run_until_idle(w, r, timeout=60)
    assert got == [Invoice(1, 250)]
    assert results(redis_url, ["inv-1"]) == [250]
    [dead] = list_dead(r, S, 10)
    assert (dead.key, dead.reason) == ("bad", "payload:invalid")


async def test_hooks_concurrency_key_schedules_and_local_cache(redis_url: str,
                                                              r: redis.Redis) -> None:
    """The class API's Python-only options work as keywords: on_start (plain def) runs
    before the first job, on_stop (async def) after the drain, concurrency_key is asked
    for each job, a schedule's ticks reach the function, local_cache=False turns the
    in-process cache off."""
    events: list[str] = []

    async def stopped() -> None:
        events.append("stop")

    def customer(msg: sw.Message) -> str:
        events.append(f"key:{msg.key}")
        return str(msg.payload["customer"])

    @sw.worker(S, group=G, on_start=lambda: events.append("start"), on_stop=stopped,
               concurrency_key=customer, concurrency_per_key=1, local_cache=False,
               schedules=[sw.Every(0.1, payload={"customer": "tick"}, name="tick")],
               **QUICK)
    async def work(msg: sw.Message) -> str:
        events.append(f"run:{msg.key}")
        return str(msg.payload["customer"])

    w = work.from_url(redis_url)
    assert w._cache is None  # local_cache=False: no in-process cache
    send(redis_url, {"a": {"customer": "c1"}, "b": {"customer": "c2"}})
    task = asyncio.create_task(w.serve())
    try:
        await await_for(lambda: {"run:a", "run:b"} <= set(events)
                        and any(e.startswith("run:tick:") for e in events), 30,
                        message="both jobs and a tick to run")
    finally:
        w.stop()
        await task
    assert events[0] == "start" and events[-1] == "stop"
    assert events.index("key:a") < events.index("run:a")
    assert events.index("key:b") < events.index("run:b")


async def test_hooks_given_as_none_are_no_hooks(redis_url: str, r: redis.Redis) -> None:
    """``on_start=None`` / ``on_stop=None`` (the typed default) mean no hook: the worker
    starts, runs its jobs and stops."""

    @sw.worker(S, group=G, on_start=None, on_stop=None, **QUICK)
    async def plain(msg: sw.Message) -> str:
        return "ok"

    send(redis_url, {"a": 1})
    await run_until_idle(plain.from_url(redis_url), r, timeout=60)
    assert results(redis_url, ["a"]) == ["ok"]


# -- refused when decorating ----------------------------------------------------------


def _decorate(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``sw.worker(S, group=G, **options)`` untyped, for options mypy would refuse."""
    factory: Any = sw.worker
    return typing.cast("Callable[[Callable[..., Any]], Any]", factory(S, group=G, **options))


async def _handler(msg: sw.Message) -> None:
    pass


@pytest.mark.parametrize(("options", "option", "text"), [
    ({"concurrency": 0}, "concurrency", "from 1 to 10000"),
    ({"visibility_timeout": -1}, "visibility_timeout", "number of seconds"),
    ({"max_deliveries": "5"}, "max_deliveries", "must be an int"),
    ({"dedup_window": 1}, "dedup_window", "redelivery horizon"),
    ({"rate_limit": "lots"}, "rate_limit", "50/s"),
    ({"catch_up": "some"}, "catch_up", "'last', 'all', 'none'"),
    ({"lock_urls": ["http://x"]}, "lock_urls", "redis://"),
    ({"concurency": 2}, "concurency", "did you mean 'concurrency'"),
    ({"fn": print}, "fn", "is not an option of @sw.worker"),
    ({"payload_type": dict}, "payload_type", "dataclass"),
    ({"local_cache": 5}, "local_cache", "mutable mapping"),
    ({"concurrency_key": "customer"}, "concurrency_key", "function of the message"),
    ({"schedules": sw.Every(60)}, "schedules", "list of"),
    ({"payload_type": Invoice, "schedules": [sw.Every(60, payload={"x": 1})]},
     "schedules", "payload_type refuses"),
    ({"on_start": 5}, "on_start", "no arguments"),
    ({"on_stop": lambda worker: None}, "on_stop", "no arguments"),
])
def test_a_bad_option_is_refused_when_decorating(options: dict[str, Any], option: str,
                                                 text: str) -> None:
    """A bad value (or a name that is no option) raises ConfigError naming the option
    when the decorator runs, through the checks a worker class gets when built."""
    with pytest.raises(sw.ConfigError, match=text) as caught:
        _decorate(**options)(_handler)
    assert caught.value.option == option


def test_a_bad_function_or_usage_is_refused_when_decorating() -> None:
    """Decorating something that does not take the message, a typed parameter without
    payload_type (or with another one), an empty stream or group, or using the
    decorator bare: each is refused at once, saying what to write instead."""

    def two(a: Any, b: Any) -> None:
        pass

    async def typed(msg: sw.Message[Invoice]) -> None:
        pass

    @dataclasses.dataclass
    class Order:
        id: int

    with pytest.raises(sw.ConfigError, match="one argument") as caught:
        _decorate()(two)
    assert caught.value.option == "handle"
    with pytest.raises(sw.ConfigError, match="decorates a function"):
        _decorate()(Invoice)
    with pytest.raises(sw.ConfigError, match="payload_type=Invoice") as caught:
        _decorate()(typed)
    assert caught.value.option == "payload_type"
    with pytest.raises(sw.ConfigError, match="make them the same type"):
        _decorate(payload_type=Order)(typed)
    assert _decorate(payload_type=Invoice)(typed).payload_type is Invoice
    factory: Any = sw.worker
    with pytest.raises(sw.ConfigError, match="group"):
        factory(S, group="")
    with pytest.raises(sw.ConfigError, match="stream"):
        factory("", group=G)
    with pytest.raises(TypeError, match="takes the stream and group first"):
        factory(_handler)


# -- streamwork run module:function ---------------------------------------------------


def _stop(proc: subprocess.Popen[bytes]) -> int:
    os.kill(proc.pid, signal.SIGTERM)
    return proc.wait(timeout=60)


def test_streamwork_run_runs_a_function_and_stops_on_sigterm(
        redis_url: str, spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """`streamwork run tests.workers.function:echo` runs the function's jobs in that
    process, and SIGTERM drains it: exit 0."""
    proc = spawn_worker("tests.workers.function:echo", redis_url)
    keys = [f"e{i}" for i in range(5)]
    send(redis_url, {k: {"n": i} for i, k in enumerate(keys)}, stream="fn-echo")
    got = results(redis_url, keys, stream="fn-echo", group="fn")
    assert got == [{"n": i, "pid": proc.pid} for i in range(5)]
    assert _stop(proc) == 0


def test_streamwork_run_function_with_processes(
        redis_url: str, tmp_path: Path,
        spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """`--processes 2` runs the function worker in two child processes (each logs that it
    serves the stream); the jobs run there, and SIGTERM to the supervisor stops both:
    exit 0."""
    log_path = tmp_path / "supervisor.log"
    with log_path.open("wb") as log:
        proc = spawn_worker("tests.workers.function:echo", redis_url, "--processes", "2",
                            "--log-level", "INFO", stdout=log)
    started = re.compile(r"worker started stream=fn-echo .*consumer=\S+-(\d+)-")

    def children() -> set[int] | None:
        pids = {int(m) for m in started.findall(log_path.read_text(errors="replace"))}
        return pids if len(pids) == 2 else None

    pids = wait_for(children, 60, message="two child processes serving fn-echo")
    assert proc.pid not in pids
    keys = [f"p{i}" for i in range(10)]
    send(redis_url, {k: {"n": i} for i, k in enumerate(keys)}, stream="fn-echo")
    got = results(redis_url, keys, stream="fn-echo", group="fn")
    assert [g["n"] for g in got] == list(range(10))
    assert {g["pid"] for g in got} <= pids  # the children ran them
    assert _stop(proc) == 0


def test_streamwork_run_a_class_and_functions_together(
        redis_url: str, r: redis.Redis,
        spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """`streamwork run tests.workers.ledger:LedgerWorker tests.workers.function:echo
    tests.workers.function:shout` hosts a class worker and two function workers (one
    async, one plain def) in one process; each runs its own stream's jobs."""
    proc = spawn_worker("tests.workers.ledger:LedgerWorker", redis_url,
                        "tests.workers.function:echo", "tests.workers.function:shout",
                        env={"SW_TEST_STREAM": "fn-ledger"})
    send(redis_url, {"l1": {}}, stream="fn-ledger")
    send(redis_url, {"e1": {"n": 1}}, stream="fn-echo")
    send(redis_url, {"s1": "quiet"}, stream="fn-shout")
    assert results(redis_url, ["e1"], stream="fn-echo", group="fn") == [
        {"n": 1, "pid": proc.pid}]
    assert results(redis_url, ["s1"], stream="fn-shout", group="fn") == ["QUIET"]
    wait_for(lambda: r.hget("ledger", "l1") == b"1", 60, message="the class worker's job")
    assert _stop(proc) == 0


def test_streamwork_run_names_function_workers_when_a_name_is_wrong() -> None:
    """A misspelt function name gets "did you mean" and the module's workers, the
    decorated functions among them; a function without the decorator is told to get
    one."""
    runner = CliRunner()
    out = runner.invoke(main, ["run", "tests.workers.function:ech", "--url",
                               "redis://127.0.0.1:1/0"])
    assert out.exit_code == 1
    assert "there is no 'ech'" in out.output and "Did you mean 'echo'?" in out.output
    assert "echo, shout" in out.output
    out = runner.invoke(main, ["run", "tests.workers.function:not_a_worker", "--url",
                               "redis://127.0.0.1:1/0"])
    assert out.exit_code == 1
    assert "not decorated with @sw.worker" in out.output
    assert workers_function.echo.__name__ == "echo"


# -- types ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mypy cache the two checks share (the second reuses streamwork's analysis), fresh
    for each run of the tests."""
    return tmp_path_factory.mktemp("mypy-cache")


@pytest.mark.parametrize(("path", "ok"), [("function_ok.py", True), ("function_bad.py", False)])
def test_decorated_functions_are_typed_for_mypy(path: str, ok: bool, mypy_cache: Path) -> None:
    """mypy --strict accepts the decorator's typical uses (the payload type and result
    carried through, the decorated name a worker class) and rejects a function whose
    payload type is not payload_type, a misspelt option, a wrongly typed option and a
    function that does not take a message."""
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir",
                          str(mypy_cache), str(ROOT / "tests" / "typecheck" / path)],
                         capture_output=True,
                         text=True, cwd=ROOT, timeout=170, check=False)
    if ok:
        assert out.returncode == 0, out.stdout + out.stderr
        return
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()

    def error_on(line: int, text: str) -> bool:
        return any(f"{path}:{line}: error:" in ln and text in ln for ln in lines)

    assert error_on(22, 'expected "Callable[[Message[Invoice]]'), out.stdout
    assert error_on(27, 'Unexpected keyword argument "concurency"'), out.stdout
    assert error_on(32, "No overload variant"), out.stdout
    assert error_on(37, 'incompatible type "Callable[[int]'), out.stdout
    assert error_on(43, '"Invoice" has no attribute "amount"'), out.stdout
