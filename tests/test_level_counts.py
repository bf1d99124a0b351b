"""A stream's figures count every priority level: length, entries added, produced/s, and
per group entries-read, lag, pending and acked/s include ``{S}:p:high`` and ``{S}:p:low``
(and the group's retry stream where it is read or lag), the same in ``inspect`` (tables and
``--json``), ``top --once``, the dashboard (its figures, page and sparklines) and the
gauges, and equal to what XINFO says of those streams added up."""

from __future__ import annotations

import asyncio
import json
import re
import time
from types import SimpleNamespace

import pytest
import redis

import streamwork as sw
from streamwork._dashboard.data import snapshot
from streamwork._dashboard.rates import RateHistory
from streamwork._ops.rates import compute_rates
from streamwork._ops.stats import stream_stats
from streamwork._redis import connection
from streamwork._telemetry import api as telemetry
from streamwork._wire.keys import StreamKeys
from streamwork._wire.priorities import sibling_streams
from streamwork._worker.core.consumer import Consumer
from streamwork._worker.core.loops import gauges
from streamwork._worker.features import FEATURES
from streamwork.testing import run_until_idle
from tests.test_cli_ops import cli, row

MIXED, PLAIN, GROUP = "lvl", "plain", "cg"


class Mixed(sw.StreamWorker):
    """Retries a job sent with ``{"retry": true}`` once, then succeeds."""

    stream = MIXED
    group = GROUP
    concurrency = 4
    read_block = 0.05
    retry_delay = 0.05
    retry_max_delay = 0.1

    async def handle(self, msg: sw.Message) -> None:
        if isinstance(msg.payload, dict) and msg.payload.get("retry") and msg.attempt < 2:
            raise sw.Retry(delay=0.05)


class Plain(Mixed):
    """The same jobs on another stream, all at the normal level."""

    stream = PLAIN


def send_round(url: str, n: int) -> int:
    """``n`` jobs per level to MIXED (a quarter of them retried once) and the same
    ``3 * n`` jobs at normal to PLAIN; returns how many each stream got."""
    payloads = [{"retry": i % 4 == 0} for i in range(n)]
    with sw.Producer.from_url(url) as p:
        for level in ("high", "normal", "low"):
            p.send_many(MIXED, payloads, priority=level)
            p.send_many(PLAIN, payloads)
    return 3 * n


def streams_of(stream: str) -> list[str]:
    return [stream, *sibling_streams(StreamKeys.for_stream(stream))]


def summed(r: redis.Redis, stream: str) -> dict[str, int]:
    """What XINFO says of the stream, its level streams and the group's retry side,
    added up (a level stream that does not exist adds nothing)."""
    gkeys = StreamKeys.for_stream(stream).group(GROUP)
    out = {"length": 0, "entries_added": 0, "entries_read": 0, "lag": 0, "pending": 0}
    for name in [*streams_of(stream), gkeys.retry]:
        if not r.exists(name):
            continue
        if name != gkeys.retry:
            info = r.xinfo_stream(name)
            out["length"] += info["length"]
            out["entries_added"] += info["entries-added"]
        for g in r.xinfo_groups(name):
            if g["name"].decode() == GROUP:
                out["entries_read"] += g["entries-read"]
                out["lag"] += g["lag"]
                out["pending"] += g["pending"]
    out["lag"] += r.zcount(gkeys.retries, "-inf", time.time() * 1000)
    return out


def leave_work(r: redis.Redis, url: str) -> None:
    """With no worker running: new jobs at every level (lag), a delivery at high and one
    of the retry stream handed to a consumer that went away (pending), a replay waiting
    on the retry stream and a due retry not promoted yet (lag)."""
    gkeys = StreamKeys.for_stream(MIXED).group(GROUP)
    with sw.Producer.from_url(url) as p:
        p.send_many(MIXED, [{}] * 5)
        p.send_many(MIXED, [{}] * 3, priority="high")
        p.send_many(MIXED, [{}] * 2, priority="low")
    r.xadd(gkeys.retry, {"d": b"x"})
    r.xadd(gkeys.retry, {"d": b"x"})
    high, _ = sibling_streams(StreamKeys.for_stream(MIXED))
    r.xreadgroup(GROUP, "gone", {high: ">"}, count=1)
    r.xreadgroup(GROUP, "gone", {gkeys.retry: ">"}, count=1)
    r.zadd(gkeys.retries, {"1:0-1:due": 0})


async def gauge(url: str, what: str) -> float | None:
    """The group's gauge after one read by the function the gauges loop runs."""
    labels = (what, MIXED, GROUP)
    telemetry._board.values.pop(labels, None)
    worker = Mixed.from_url(url)
    consumer = Consumer(worker.handle, worker.config, worker.url, "probe", features=FEATURES)
    try:
        await gauges.read_gauges(consumer.ctx)
    finally:
        await consumer.redis.aclose()
    return telemetry._board.values.get(labels)


async def test_inspect_the_dashboard_and_the_gauges_count_every_level(
        redis_url: str, r: redis.Redis) -> None:
    """Jobs served at every level (some retried), then more left waiting: inspect --json,
    the tables, the dashboard's figures and page and the gauges show the sums of XINFO
    over the stream, its two level streams and the group's retry stream."""
    send_round(redis_url, 8)
    await run_until_idle(Mixed.from_url(redis_url), r, timeout=60)
    leave_work(r, redis_url)
    want = summed(r, MIXED)
    high, low = sibling_streams(StreamKeys.for_stream(MIXED))
    assert want["length"] > r.xlen(MIXED) and want["entries_read"] > 0  # levels matter
    assert (want["lag"], want["pending"]) == (5 + (3 - 1) + 2 + (2 - 1) + 1, 2)

    out = cli("inspect", MIXED, "--json", "--url", redis_url)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    [g] = doc["groups"]
    got = {"length": doc["length"], "entries_added": doc["entries_added"],
           "entries_read": g["entries_read"], "lag": g["lag"], "pending": g["pending"]}
    assert got == want
    assert doc["level_length"] == {"high": r.xlen(high), "low": r.xlen(low)}
    assert g["priority_lag"] == {"high": 2, "low": 2}

    text = cli("inspect", MIXED, "--url", redis_url)
    assert text.exit_code == 0, text.output
    assert row(text.stdout, str(want["length"]))[1] == str(want["entries_added"])
    cells = row(text.stdout, GROUP)
    assert cells[2:5] == [str(want["entries_read"]), str(want["lag"]), str(want["pending"])]

    client = connection.sync_client(redis_url)
    try:
        [s] = [s for s in snapshot(client) if s.stream == MIXED]
    finally:
        client.close()
    assert s.as_json() == {**doc, "taken_at_ms": s.taken_at_ms, "groups": [
        {**g, "consumer_list": s.as_json()["groups"][0]["consumer_list"],
         "oldest_pending_age_s": s.groups[0].oldest_pending_age_s}]}
    assert await gauge(redis_url, "lag") == want["lag"]
    assert await gauge(redis_url, "pending") == want["pending"]

    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    pytest.importorskip("jinja2", reason="the dashboard extra is not installed")
    from starlette.testclient import TestClient

    from streamwork._dashboard.app import DashboardSettings, create_app

    settings = DashboardSettings(redis_url, refresh_s=0, sample_interval_s=60)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as web:
        page = web.get("/")
    assert page.status_code == 200, page.text
    section = page.text[page.text.index(f"<h2>stream {MIXED}"):]
    assert re.search(r'data-metric="length">([^<]*)<', section)[1] == str(want["length"])
    assert re.search(r"<dt>entries added</dt><dd>([^<]*)<", section)[1] == str(
        want["entries_added"])
    group = section[section.index(f'<tr data-group="{GROUP}">'):]
    group = group[:group.index("</tr>")]
    cells = dict(re.findall(r'data-metric="(lag|pending)"[^>]*>([^<]*)<', group))
    assert cells == {"lag": str(want["lag"]), "pending": str(want["pending"])}
    read = re.search(r'data-metric="retries_waiting">[^<]*</td>\s*<td class="num">([^<]*)<',
                     group)
    assert read is not None and read[1] == str(want["entries_read"])


async def test_rates_count_every_level_and_the_retry_stream(redis_url: str,
                                                            r: redis.Redis) -> None:
    """Between two samples, produced/s times the interval is the jobs sent at every level,
    and acked/s times it what the group read from all its streams (retries included) and
    no longer holds; the dashboard's sparkline points are the same rates."""
    send_round(redis_url, 4)  # the groups exist on every level
    await run_until_idle(Mixed.from_url(redis_url), r, timeout=60)
    before = stream_stats(r, MIXED)
    history = RateHistory(4)
    history.add([before])
    sent = send_round(redis_url, 8)
    await run_until_idle(Mixed.from_url(redis_url), r, timeout=60)
    after = stream_stats(r, MIXED)
    history.add([after])
    rates = compute_rates(before, after)
    seconds = rates.interval_s
    assert rates.produced_per_s is not None
    assert round(rates.produced_per_s * seconds) == sent
    retried = 3 * 2  # a quarter of each level's 8, read again from the retry stream
    acked = rates.acked_per_s[GROUP]
    assert acked is not None and round(acked * seconds) == sent + retried
    assert history.produced(MIXED) == [rates.produced_per_s]
    assert history.acked(MIXED, GROUP) == [acked]


def test_top_shows_the_same_rates_for_jobs_at_every_level_as_for_normal_ones(
        redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """``top --once`` while the same jobs are sent and served on two streams, one at every
    level, one all normal: the same length, produced/s and acked/s for both (both are
    sampled at the same server time)."""
    from streamwork._cli import top

    send_round(redis_url, 2)  # the groups exist on every level
    asyncio.run(run_until_idle(Mixed.from_url(redis_url), r, timeout=60))
    asyncio.run(run_until_idle(Plain.from_url(redis_url), r, timeout=60))
    real_sleep = time.sleep

    def work_meanwhile(seconds: float) -> None:
        """top's wait between its two samples: the jobs are sent and served then."""
        send_round(redis_url, 8)
        for worker in (Mixed, Plain):
            asyncio.run(run_until_idle(worker.from_url(redis_url), r, timeout=60))
        real_sleep(seconds)

    monkeypatch.setattr(top, "time", SimpleNamespace(sleep=work_meanwhile))
    out = cli("top", "--once", "--interval", "0.1", "--url", redis_url)
    assert out.exit_code == 0, out.output
    mixed, plain = row(out.stdout, MIXED), row(out.stdout, PLAIN)
    assert mixed[1] == plain[1] == str(summed(r, MIXED)["length"])
    assert float(mixed[2]) > 0 and mixed[2] == plain[2], out.stdout  # produced/s
    acked = row(out.stdout, f"{MIXED}/{GROUP}")[4], row(out.stdout, f"{PLAIN}/{GROUP}")[4]
    assert float(acked[0]) > 0 and acked[0] == acked[1], out.stdout
