"""Periodic jobs: `Every` / `Cron` schedules enqueue each tick once across all
workers (tick.lua + job records), even when a worker is SIGKILLed mid-run; catch_up decides
what becomes of ticks missed while no worker ran; `streamwork schedules` lists them."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from click.testing import CliRunner
from cronsim import CronSim

import streamwork as sw
from streamwork._cli.schedules import schedules as schedules_command
from streamwork._redis import scripts
from streamwork._wire.codec import decode_body
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names, partition_of
from streamwork._wire.schedules import MAX_CATCH_UP, MISSED_AFTER_MS, plan, tick_key, tick_text
from streamwork._worker.config import WorkerConfig
from streamwork._worker.features.schedules import SCHEDULE_HEADER, TICK_HEADER, Scheduler
from streamwork.testing import run_until_idle, wait_for
from tests.helpers.slots import key_slot
from tests.workers.schedules import LEDGER, STREAM, EverySecond, Ticker, Weekly

WEEK_MS = 7 * 86_400_000
UTC = dt.timezone.utc


def _ms(when: dt.datetime) -> int:
    return int(when.timestamp() * 1000)


# ---- schedules and their ticks (pure) ----------------------------------------------------


def test_every_ticks_on_multiples_of_its_interval() -> None:
    """Every(n) ticks at the multiples of n s of Unix time; sub-second intervals work."""
    half = sw.Every(0.5)
    assert half.name == "every-0.5s" and sw.Every(60).name == "every-60s"
    assert half.next_after(1_000) == 1_500 and half.next_after(1_499) == 1_500
    assert half.ticks(1_000, 3_000, 10) == ([1_500, 2_000, 2_500, 3_000], False)
    assert half.ticks(1_000, 3_000, 2) == ([2_500, 3_000], True)  # the latest, and more
    assert half.ticks(3_000, 3_000, 10) == ([], False)
    assert sw.Every(dt.timedelta(minutes=1)).interval_ms == 60_000


def test_tick_keys_are_fixed_width_iso_utc() -> None:
    """A tick's job key is `<name>:<ISO 8601 UTC with ms>`, the same on every worker."""
    assert tick_text(0) == "1970-01-01T00:00:00.000Z"
    assert tick_key("every-0.5s", 1_796_054_400_500) == "every-0.5s:2026-11-30T16:00:00.500Z"


def test_cron_next_ticks_in_its_time_zone_match_the_library() -> None:
    """Cron ticks are what cronsim yields in the schedule's time zone, as Unix ms, forwards
    (next_after) and backwards (ticks), across both DST changes of Europe/Berlin."""
    berlin = ZoneInfo("Europe/Berlin")
    for expr in ("*/5 * * * *", "30 2 * * *", "0 9 * * MON-FRI", "15 */7 * * *", "0 0 L * *"):
        cron = sw.Cron(expr, tz="Europe/Berlin")
        for start in (dt.datetime(2026, 3, 28, 12, tzinfo=UTC),
                      dt.datetime(2026, 10, 24, 23, 45, tzinfo=UTC)):
            expected = CronSim(expr, start.astimezone(berlin))
            want = [_ms(next(expected)) for _ in range(30)]
            got, at = [], _ms(start)
            for _ in range(30):
                at = cron.next_after(at)  # type: ignore[assignment]
                got.append(at)
            assert got == want, expr
            # backwards: the same ticks, ascending, from the window they fill
            assert cron.ticks(_ms(start), want[-1], 100) == (want, False)


def test_cron_dst_changes_are_handled_by_the_library() -> None:
    """As Debian's cron does it, in Berlin: a job at 02:30 runs at 03:00 on the spring day
    that has no 02:30, and once (not twice) on the autumn day that has two; a job every
    half hour runs at both 02:00 and both 02:30 of the autumn day."""
    daily = sw.Cron("30 2 * * *", tz="Europe/Berlin")
    spring = daily.next_after(_ms(dt.datetime(2026, 3, 28, 12, tzinfo=UTC)))
    assert spring == _ms(dt.datetime(2026, 3, 29, 1, 0, tzinfo=UTC))  # 03:00 CEST
    start = _ms(dt.datetime(2026, 10, 24, 23, 0, tzinfo=UTC))
    late = start + 3 * 3_600_000

    def utc_times(cron: sw.Cron) -> list[str]:
        return [tick_text(t)[11:16] for t in cron.ticks(start, late, 10)[0]]

    assert utc_times(sw.Cron("0,30 2 * * *", tz="Europe/Berlin")) == ["00:00", "00:30"]
    assert utc_times(sw.Cron("*/30 * * * *", tz="Europe/Berlin")) == [
        "23:30", "00:00", "00:30", "01:00", "01:30", "02:00"]


def test_cron_seconds_field_and_names() -> None:
    """A sixth field (first) gives seconds; default names carry the expression (and the
    time zone outside UTC); a name of one's own replaces it."""
    every_second = sw.Cron("* * * * * *")
    assert every_second.next_after(1_000) == 2_000
    assert every_second.name == "cron-* * * * * *"
    assert sw.Cron("0 * * * *", tz="Europe/Berlin").name == "cron-0 * * * *@Europe/Berlin"
    assert sw.Cron("0 * * * *", name="hourly").name == "hourly"


@pytest.mark.parametrize(("make", "says"), [
    (lambda: sw.Cron("61 * * * *"), "cron expression"),
    (lambda: sw.Cron("not a cron"), "cron expression"),
    (lambda: sw.Cron("0 0 */20 * 1L"), "never matches"),  # the 1st or 21st, last Monday
    (lambda: sw.Cron("* * * * *", tz="Mars/Olympus_Mons"), "unknown time zone"),
    (lambda: sw.Cron("* * * * *", tz=""), "IANA"),
    (lambda: sw.Every(0), "seconds >= 0.1"),
    (lambda: sw.Every(-60), "seconds >= 0.1"),
    (lambda: sw.Every(0.05), "seconds >= 0.1"),
    (lambda: sw.Every(0.1234), "whole milliseconds"),
    (lambda: sw.Every("60"), "seconds"),  # type: ignore[arg-type]
    (lambda: sw.Every(60, payload=object()), "MessagePack"),
    (lambda: sw.Every(60, name=""), "name"),
])
def test_bad_schedules_are_refused_saying_what_to_do(make: Callable[[], Any],
                                                      says: str) -> None:
    """A bad cron expression, time zone, interval, payload or name raises ConfigError at
    construction, naming `schedules` and what is accepted."""
    with pytest.raises(sw.ConfigError, match=says) as err:
        make()
    assert err.value.option == "schedules"


def test_worker_refuses_duplicate_names_a_bad_list_and_a_bad_catch_up() -> None:
    """Two schedules with one name, a schedule that is not one, a payload over
    max_payload_bytes, or an unknown catch_up: ConfigError when the worker is built."""
    with pytest.raises(sw.ConfigError, match="two schedules are named 'every-60s'"):
        Weekly.from_url(schedules=[sw.Every(60), sw.Every(60, payload=1)])
    with pytest.raises(sw.ConfigError, match=r"sw.Every\(...\)"):
        Weekly.from_url(schedules=["*/5 * * * *"])
    with pytest.raises(sw.ConfigError, match="too large"):
        Weekly.from_url(schedules=[sw.Every(60, payload="x" * 200)], max_payload_bytes=100)
    with pytest.raises(sw.ConfigError, match="catch_up"):
        Weekly.from_url(catch_up="sometimes")
    ok = Weekly.from_url(schedules=[sw.Every(60), sw.Every(60, name="other")], catch_up="all")
    assert [s.name for s in ok.schedules] == ["every-60s", "other"]
    assert ok.config.catch_up == "all" and Weekly.from_url().config.catch_up == "last"


def test_plan_enqueues_ticks_on_time_and_applies_catch_up_to_missed_ones() -> None:
    """Ticks at most MISSED_AFTER_MS late are always enqueued; of the missed ones "all"
    enqueues each, "last" the latest (none when a tick on time follows), "none" none."""
    now = 100 * MISSED_AFTER_MS
    missed = [now - 4 * MISSED_AFTER_MS, now - 3 * MISSED_AFTER_MS, now - 2 * MISSED_AFTER_MS]
    on_time = [now - MISSED_AFTER_MS, now - 1]
    assert plan(missed + on_time, now, "all") == missed + on_time
    assert plan(missed + on_time, now, "last") == on_time
    assert plan(missed + on_time, now, "none") == on_time
    assert plan(missed, now, "all") == missed
    assert plan(missed, now, "last") == missed[-1:]
    assert plan(missed, now, "none") == []
    assert plan(on_time, now, "none") == on_time


def test_tick_keys_share_the_slot_of_the_stream_they_feed() -> None:
    """A schedule's last-tick key, and the stream its jobs go to, are in its partition's
    slot (the schedule's name picks the partition); their names are refused as streams."""
    cfg = WorkerConfig(stream="orders", group="billing", partitions=6)
    sched = Scheduler([sw.Every(60), sw.Cron("0 * * * *", name="hourly")], cfg,
                      "redis://127.0.0.1:1/0", "c")
    names = partition_names("orders", 6)
    for st in sched.states:
        assert key_slot(st.tick_key) == key_slot(st.stream)
        assert any(st.stream == StreamKeys.for_stream(n).group("billing").retry
                   for n in names)
        for owned in (st.tick_key, StreamKeys.for_stream("orders").group("billing").schedules):
            with pytest.raises(sw.ConfigError, match="key streamwork keeps"):
                StreamKeys.for_stream(owned)


# ---- tick.lua ------------------------------------------------------------------------------


def test_tick_script_enqueues_each_tick_once_and_never_early(r: redis.Redis) -> None:
    """Two workers offering the same ticks: the first enqueues, the second nothing; an
    older tick is never enqueued after a newer one; a tick in the future is refused."""
    run = scripts.SyncScripts(r).run
    g = StreamKeys.for_stream("s").group("g")
    seconds, _ = r.time()
    now = int(seconds) * 1000
    bodies = [(now - 2000, b"a"), (now - 1000, b"b")]
    done, last, server_now = run(scripts.tick(g.retry, g.tick("x"), now - 1000, bodies))
    assert (done, last) == (2, now - 1000) and server_now >= now
    assert run(scripts.tick(g.retry, g.tick("x"), now - 1000, bodies))[:2] == [0, now - 1000]
    assert run(scripts.tick(g.retry, g.tick("x"), now - 2000, bodies[:1]))[0] == 0
    future = now + 3_600_000
    assert run(scripts.tick(g.retry, g.tick("x"), future, [(future, b"c")]))[:2] == [
        0, now - 1000]
    assert [f[b"d"] for _, f in r.xrange(g.retry)] == [b"a", b"b"]


# ---- workers ---------------------------------------------------------------------------------


def _holding_pid(r: redis.Redis, procs: list[subprocess.Popen[bytes]]) -> int | None:
    """The pid of a live worker process holding a tick's delivery right now, if any."""
    retry = StreamKeys.for_stream(STREAM).group(Ticker.group).retry
    try:
        summary: Any = r.xpending(retry, Ticker.group)
    except redis.ResponseError:
        return None
    live = {p.pid for p in procs if p.poll() is None}
    for consumer in summary.get("consumers") or []:
        pid = int(consumer["name"].decode().rsplit("-", 2)[1])
        if pid in live and int(consumer["pending"]) > 0:
            return pid
    return None


def test_three_workers_one_sigkilled_enqueue_each_tick_exactly_once(
        r: redis.Redis, redis_url: str,
        spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """3 worker processes run an Every(0.5) schedule for about 5 s; one is SIGKILLed while
    it holds a tick mid-handler. The ledger holds every tick from the first to the last
    one decided, each exactly once."""
    procs = [spawn_worker("tests.workers.schedules:Ticker", redis_url) for _ in range(3)]
    wait_for(lambda: r.hlen(LEDGER) >= 1, 30, message="the first tick to be handled")
    victim = wait_for(lambda: _holding_pid(r, procs), 15,
                      message="a worker holding a tick mid-handler")
    os.kill(victim, signal.SIGKILL)
    # the survivors tick on: about 5 s of Every(0.5) is 10 ticks handled
    wait_for(lambda: r.hlen(LEDGER) >= 10, 60, message="10 ticks handled by the survivors")
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(timeout=30)
    # what the killed worker held is reclaimed and run by a worker without schedules
    drainer = Ticker.from_url(redis_url, schedules=[])
    asyncio.run(run_until_idle(drainer, r, timeout=30))
    last = int(r.get(StreamKeys.for_stream(STREAM).group(Ticker.group).tick("every-0.5s")))
    ledger = {k.decode(): int(v) for k, v in r.hgetall(LEDGER).items()}
    first = min(ledger)
    start_ms = next(t for t in range(last, 0, -500) if tick_key("every-0.5s", t) == first)
    expected = {tick_key("every-0.5s", t): 1 for t in range(start_ms, last + 1, 500)}
    assert ledger == expected, {k: v for k, v in ledger.items() if expected.get(k) != v}
    assert len(expected) >= 8  # about 5 s of ticks


def _past_weeks(r: redis.Redis, weeks: int) -> tuple[int, list[int]]:
    """(last tick recorded `weeks` weeks back, the weekly ticks since then), on the
    server's clock; skips in the minute after a weekly tick (it would be on time)."""
    seconds, _ = r.time()
    now = int(seconds) * 1000
    latest = now // WEEK_MS * WEEK_MS
    if now - latest < 60_000:
        pytest.skip("a weekly tick fell due a moment ago; it would count as on time")
    recorded = latest - weeks * WEEK_MS
    return recorded, list(range(recorded + WEEK_MS, latest + 1, WEEK_MS))


@pytest.mark.parametrize(("catch_up", "weeks", "expect"), [
    ("all", 10, slice(None)),
    ("last", 10, slice(-1, None)),
    ("none", 10, slice(0, 0)),
    ("all", MAX_CATCH_UP + 50, slice(-MAX_CATCH_UP, None)),
])
def test_catch_up_decides_what_becomes_of_missed_ticks(r: redis.Redis, redis_url: str,
                                                       catch_up: str, weeks: int,
                                                       expect: slice) -> None:
    """With the schedule's last tick recorded weeks ago (every worker was down since),
    a starting worker enqueues every missed tick ("all", at most the latest 1000), only
    the latest ("last") or none ("none"), and records the latest as decided."""
    tick = StreamKeys.for_stream("weekly").group(Weekly.group).tick("weekly")
    recorded, missed = _past_weeks(r, weeks)
    r.set(tick, recorded)
    worker = Weekly.from_url(redis_url, catch_up=catch_up)

    async def serve_until_decided() -> None:
        task = asyncio.create_task(worker.serve())
        try:
            await asyncio.to_thread(wait_for, lambda: int(r.get(tick)) == missed[-1], 20,
                                    message="the missed ticks to be decided")
        finally:
            worker.stop()
            await task

    asyncio.run(serve_until_decided())
    retry = StreamKeys.for_stream("weekly").group(Weekly.group).retry
    keys = [decode_body(f[b"d"]).key for _, f in r.xrange(retry)]
    assert keys == [tick_key("weekly", t) for t in missed[expect]]


def test_every_second_cron_fires_once_per_tick_and_cli_lists_next_runs(
        r: redis.Redis, redis_url: str) -> None:
    """Two workers with a `* * * * * *` cron (Europe/Berlin) run each second's tick once;
    `streamwork schedules STREAM --json` then lists both schedules with the last tick and
    the next run of each."""
    workers = [EverySecond.from_url(redis_url) for _ in range(2)]

    async def serve_a_while() -> None:
        tasks = [asyncio.create_task(w.serve()) for w in workers]
        await asyncio.to_thread(wait_for, lambda: r.hlen("{crons}:ledger") >= 3, 20,
                                message="three ticks of the every-second cron")
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks)

    asyncio.run(serve_a_while())
    asyncio.run(run_until_idle(EverySecond.from_url(redis_url, schedules=[]), r))
    ledger = {k.decode(): int(v) for k, v in r.hgetall("{crons}:ledger").items()}
    assert set(ledger.values()) == {1}
    seconds = sorted(int(dt.datetime.fromisoformat(k.split(":", 1)[1][:-1] + "+00:00")
                         .timestamp()) for k in ledger)
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds)))
    retry = StreamKeys.for_stream("crons").group(EverySecond.group).retry
    headers = decode_body(r.xrange(retry, count=1)[0][1][b"d"]).headers
    assert headers[SCHEDULE_HEADER] == "each-second" and int(headers[TICK_HEADER]) > 0

    result = CliRunner().invoke(schedules_command, ["crons", "--json", "--url", redis_url])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert set(rows) == {"each-second", "every-3600s"}
    cron, hourly = rows["each-second"], rows["every-3600s"]
    assert (cron["group"], cron["kind"], cron["cron"], cron["tz"]) == (
        "croners", "cron", "* * * * * *", "Europe/Berlin")
    assert cron["last_tick_ms"] == seconds[-1] * 1000
    assert cron["next_run_ms"] > cron["last_tick_ms"] and cron["next_run_ms"] % 1000 == 0
    assert cron["next_run"].endswith(("+01:00", "+02:00"))  # shown in its time zone
    assert (hourly["kind"], hourly["every"], hourly["catch_up"]) == ("every", 3600, "last")
    assert hourly["next_run_ms"] % 3_600_000 == 0 and hourly["last_tick_ms"] is None
    assert 0 < hourly["next_in_s"] <= 3600 and not hourly["stale"]
    table = CliRunner().invoke(schedules_command, ["crons", "--url", redis_url],
                               env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "each-second" in table.output, table.output
    empty = CliRunner().invoke(schedules_command, ["nothing-here", "--url", redis_url])
    assert empty.exit_code == 0 and "no schedules published" in empty.output


def test_partitioned_worker_enqueues_into_the_schedules_partition(r: redis.Redis,
                                                                 redis_url: str) -> None:
    """On a partitioned stream a schedule's ticks go to the partition its name picks (the
    order key), and run there once each."""
    ledger = "{parts}:ledger"

    class Recording(Ticker):
        async def handle(self, msg: sw.Message) -> None:
            msg.stage("HINCRBY", [ledger], [f"{msg.stream}|{msg.key}", 1])

    worker = Recording.from_url(redis_url, stream="parts", partitions=3,
                                schedules=[sw.Every(0.5, name="p")])

    async def serve_a_while() -> None:
        task = asyncio.create_task(worker.serve())
        await asyncio.to_thread(wait_for, lambda: r.hlen(ledger) >= 2, 20,
                                message="two ticks on the partitioned stream")
        worker.stop()
        await task

    asyncio.run(serve_a_while())
    seen = {k.decode().split("|")[0] for k in r.hgetall(ledger)}
    home = partition_names("parts", 3)[partition_of("p", 3)]
    assert seen == {home}
    assert set(r.hgetall(ledger).values()) == {b"1"}
