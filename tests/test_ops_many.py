"""Many streams on a real server: `inspect`'s and the dashboard's figures stay right, and
reading them costs a few round trips per page, not a few per stream (counted: the client's
writes to its socket, and the commands Redis ran)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from streamwork._ops import stats
from streamwork._ops.partitioned import partitioned_stats
from streamwork._producer.shells import Producer
from streamwork._redis import connection
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names
from streamwork.errors import StreamNotFound

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("jinja2", reason="the dashboard extra is not installed")

from starlette.testclient import TestClient

from streamwork._dashboard import data
from streamwork._dashboard.app import DashboardSettings, create_app
from streamwork._dashboard.paging import PAGE_SIZE

MANY = 230  #: more than one read chunk (200) and more than two pages (100)
PARTITIONED = ("events", "clicks")  #: also there, each split in 3


def name(i: int) -> str:
    return f"s-{i:04d}"


def jobs(i: int) -> int:
    return 3 + i % 5


def held(i: int) -> int:
    """Deliveries stream ``i``'s group "work" holds (read, not acked)."""
    return i % 3


def seed(url: str, r: redis.Redis, n: int) -> None:
    """n streams: ``jobs(i)`` entries, group "work" read ``held(i)`` of them (consumer
    ``c{i%2}``); every 10th also has group "audit" (nothing read), every 7th 2 dead
    letters, every 11th 2 delayed jobs (1 due); plus the partitioned streams."""
    with Producer.from_url(url) as producer:
        for i in range(n):
            producer.send_many(name(i), [{"i": i, "j": j} for j in range(jobs(i))])
    with Producer.from_url(url, partitions=3) as p3:
        for stream in PARTITIONED:  # fixed keys: the same partitions every run
            p3.send_many(stream, [{"j": j} for j in range(6)], keys=[f"k{j}" for j in range(6)])
            assert all(r.exists(p) for p in partition_names(stream, 3)), "a partition is empty"
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        keys = StreamKeys.for_stream(name(i))
        pipe.xgroup_create(name(i), "work", id="0")
        if i % 10 == 0:
            pipe.xgroup_create(name(i), "audit", id="0")
        if held(i):
            pipe.xreadgroup("work", f"c{i % 2}", {name(i): ">"}, count=held(i))
        if i % 7 == 0:
            for k in range(2):
                pipe.xadd(keys.dead, {"reason": "declined", "src_stream": name(i),
                                      "attempts": "1", "group": "work", "error_type": "E",
                                      "detail": f"dead {k} of {name(i)}"})
        if i % 11 == 0:
            pipe.zadd(keys.delayed, {f"due-{i}": 0, f"later-{i}": 9_999_999_999_999})
    pipe.execute()


class _Counting(redis.Connection):
    """A connection that counts its writes: one per command sent alone, one per pipeline."""

    writes = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).writes += 1
        super().send_packed_command(command, check_health)


@pytest.fixture(name="counting")
def _counting(redis_url: str) -> Iterator[redis.Redis]:
    """A client like the dashboard's whose round trips are counted in _Counting.writes."""
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=_Counting)
    client = redis.Redis(connection_pool=pool)
    yield client
    client.close()


def commands(r: redis.Redis) -> int:
    """Commands Redis ran since the last CONFIG RESETSTAT (without INFO and CONFIG)."""
    return sum(int(v["calls"]) for k, v in r.info("commandstats").items()
               if k not in ("cmdstat_info", "cmdstat_config"))


def calls(r: redis.Redis, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def everything() -> list[str]:
    """Every stream the page lists, in name order (a partitioned stream once)."""
    return sorted([*PARTITIONED, *(name(i) for i in range(MANY))])


def page_streams(html: str) -> list[str]:
    return re.findall(r'<section class="card stream" id="s\d+" data-stream="([^"]+)"', html)


def test_figures_of_many_streams_are_each_streams_own(redis_url: str, r: redis.Redis) -> None:
    """Read together (two chunks), each stream's length, groups, lag, pending, oldest
    pending, consumers, delayed and dead letters are its own; names that are no stream are
    skipped by sample and said so by stream_stats."""
    seed(redis_url, r, MANY)
    r.hset("a-hash", "f", "v")
    client = connection.sync_client(redis_url)
    try:
        names = [name(i) for i in range(MANY)]
        got = {s.stream: s for s in stats.sample(client, [*names, "a-hash", "nothing"])}
        assert sorted(got) == names
        for i in range(MANY):
            s = got[name(i)]
            assert (s.length, s.dead) == (jobs(i), 2 if i % 7 == 0 else 0), s.stream
            assert (s.delayed_total, s.delayed_due) == ((2, 1) if i % 11 == 0 else (0, 0))
            assert [g.name for g in s.groups] == (["audit", "work"] if i % 10 == 0
                                                  else ["work"])
            work = s.group("work")
            assert work is not None
            assert (work.lag, work.pending) == (jobs(i) - held(i), held(i)), s.stream
            first = r.xrange(name(i), count=1)[0][0].decode()
            assert work.oldest_pending_id == (first if held(i) else None)
            assert (work.oldest_pending_age_s is not None) == bool(held(i))
            assert work.top_consumers == ([(f"c{i % 2}", held(i))] if held(i) else [])
            assert [c.name for c in work.consumer_list] == ([f"c{i % 2}"] if held(i) else [])
            audit = s.group("audit")
            if audit is not None:
                assert (audit.lag, audit.pending, audit.consumers) == (jobs(i), 0, 0)
        with pytest.raises(StreamNotFound, match="is a hash, not a stream"):
            stats.stream_stats(client, "a-hash")
        with pytest.raises(StreamNotFound, match="does not exist"):
            stats.stream_stats(client, "nothing")
        events = partitioned_stats(client, "events", 3)
        assert (events.length, len(events.partitions)) == (6, 3)
    finally:
        client.close()


def test_the_page_costs_a_few_round_trips_not_a_few_per_stream(
        redis_url: str, r: redis.Redis, counting: redis.Redis) -> None:
    """The dashboard page over 230 streams (and 2 partitioned ones) costs about a dozen
    round trips, and Redis runs a bounded number of commands per stream: reading them one
    by one, as before, took about 11 round trips per stream (2,688 in all)."""
    seed(redis_url, r, MANY)
    app = create_app(DashboardSettings(redis_url, refresh_s=0), client=counting)
    web = TestClient(app, base_url="http://127.0.0.1:8321")  # no lifespan: no sampler
    assert web.get("/").status_code == 200  # the client connects (HELLO, CLIENT SETINFO)
    r.config_resetstat()
    _Counting.writes = 0
    page = web.get("/")
    assert page.status_code == 200
    trips, ran, scans = _Counting.writes, commands(r), calls(r, "scan")
    # SCAN (1,000 keys a call), the recorded partition counts, the 236 streams (230 and 6
    # partitions: 2 chunks of TIME + 3 pipelines), the partitions' owners, the dead letters
    assert trips - scans <= 1 + 2 * 4 + 1 + 1, f"{trips} round trips ({scans} SCANs)"
    per_stream = (ran - scans) / (MANY + 6)
    # per stream: XINFO STREAM and GROUPS, ZCARD delayed, XLEN dead and outbox, EXISTS of
    # the priority levels; per group XPENDING, XINFO CONSUMERS, the retry side's two reads,
    # HGETALL of its pause hash
    assert per_stream <= 11, f"{ran} commands: {per_stream:.1f} per stream"
    assert page_streams(page.text) == everything()[:PAGE_SIZE]

    _Counting.writes = 0
    r.config_resetstat()
    assert len(data.snapshot(counting)) == MANY + len(PARTITIONED)
    assert _Counting.writes - calls(r, "scan") <= 1 + 2 * 4 + 1


def overview_rows(html: str) -> list[str]:
    table = html.split('id="overview"', 1)[1].split("</section>", 1)[0]
    return re.findall(r'<td><a href="#s\d+">([^<]+)</a>', table)


@pytest.fixture(name="web")
def _web(redis_url: str, r: redis.Redis) -> Iterator[TestClient]:
    """The dashboard over the seeded streams (in-process, no sampler)."""
    seed(redis_url, r, MANY)
    client = connection.sync_client(redis_url)
    yield TestClient(create_app(DashboardSettings(redis_url, refresh_s=0), client=client),
                     base_url="http://127.0.0.1:8321")
    client.close()


def test_the_page_lists_every_stream_a_hundred_at_a_time(web: TestClient) -> None:
    """Page after page (by the page's own next links) shows every stream once, in name
    order, the overview rows and the cards alike; a page past the last is the last."""
    seen: list[str] = []
    url: str | None = "/"
    while url is not None:
        html = web.get(url).text
        shown = page_streams(html)
        assert overview_rows(html) == shown and 0 < len(shown) <= PAGE_SIZE
        seen += shown
        found = re.search(r'<a href="([^"]+)" rel="next">', html)
        url = found[1].replace("&amp;", "&") if found else None
    assert seen == everything()
    last = web.get("/?page=99").text
    assert page_streams(last) == everything()[2 * PAGE_SIZE:]
    assert "page 3 of 3" in last


def test_filter_and_worst_first_orders(web: TestClient, r: redis.Redis) -> None:
    """?q= keeps the names holding the text; ?sort=lag puts the largest lag first (ties
    by name), ?sort=dead those with dead letters; the redirect after an action on a
    stream shows the page holding it."""
    assert page_streams(web.get("/?q=s-01").text) == [name(i) for i in range(100, 200)]
    assert page_streams(web.get("/?q=S-022").text) == [name(i) for i in range(220, 230)]
    for _ in range(3):  # 9 entries not read: the worst lag (others have 7 at most)
        r.xadd(name(123), {"d": b"x"})
    by_lag = page_streams(web.get("/?sort=lag").text)
    assert by_lag[0] == name(123)
    lags = {i: jobs(i) - held(i) for i in range(MANY)}
    assert by_lag[1] == name(min(i for i in lags if lags[i] == max(lags.values())))
    by_dead = page_streams(web.get("/?sort=dead").text)
    assert by_dead[:33] == [name(i) for i in range(0, MANY, 7)]
    assert page_streams(web.get(f"/?done=replayed&n=1&skipped=0&stream={name(150)}").text
                        ) == everything()[PAGE_SIZE:2 * PAGE_SIZE]


def test_the_first_page_is_the_first_rate_sample(redis_url: str, r: redis.Redis) -> None:
    """The dashboard does not read every stream twice when it starts and the page is
    opened at once: the first page's read is the rate sampler's first sample, and the
    sampler reads again only an interval later."""
    seed(redis_url, r, 20)
    client = connection.sync_client(redis_url)
    settings = DashboardSettings(redis_url, refresh_s=0, sample_interval_s=600, window_s=1200)
    r.config_resetstat()
    with TestClient(create_app(settings, client=client), base_url="http://127.0.0.1:8321") as web:
        assert web.get("/").status_code == 200
    client.close()  # the lifespan is over: the sampler thread has stopped
    assert calls(r, "xinfo|stream") == 20 + 6  # each stream and partition read once


def test_inspect_prints_a_line_per_stream_when_there_are_many(redis_url: str,
                                                              r: redis.Redis) -> None:
    """`streamwork inspect` over more than 50 streams prints one line each with the
    figures of `inspect --json` (worst lag, pending summed over the groups), not three
    tables each; the JSON is unchanged."""
    from click.testing import CliRunner

    from streamwork._cli.inspect import OVERVIEW_OVER
    from streamwork._cli.main import main

    seed(redis_url, r, MANY)
    run = CliRunner().invoke(main, ["inspect", "--url", redis_url])
    assert run.exit_code == 0, run.output
    lines = run.stdout.splitlines()
    assert lines[0].split() == ["stream", "length", "groups", "lag", "(max)", "pending",
                                "oldest", "pending", "delayed", "due/all", "dead"]
    # without --partitions, each partition is a stream of its own (as in --json)
    expected = sorted([name(i) for i in range(MANY)]
                      + [p for s in PARTITIONED for p in partition_names(s, 3)])
    rows = {cells[0]: cells for cells in (line.split() for line in lines[1:len(expected) + 1])}
    assert sorted(rows) == expected and len(expected) > OVERVIEW_OVER
    docs = json.loads(CliRunner().invoke(main, ["inspect", "--json", "--url", redis_url]).stdout)
    assert [doc["stream"] for doc in docs] == expected
    for doc in docs:
        cells = rows[doc["stream"]]
        lag = max((g["lag"] for g in doc["groups"]), default="-")  # a partition: no group
        pending = sum(g["pending"] for g in doc["groups"])
        assert cells[1:5] == [str(doc["length"]), str(len(doc["groups"])), str(lag),
                              str(pending)], cells
        assert cells[-4:] == [str(doc["delayed_due"]), "/", str(doc["delayed_total"]),
                              str(doc["dead"])]
    assert "stream s-0001" not in run.stdout and "236 streams, one line each" in run.stdout


def test_figures_on_a_cluster(make_server: Any) -> None:
    """On a 3-master Cluster the pipelined reads (split per node by the client) give each
    stream its own figures, and a partitioned stream its partitions' sums with each
    partition's node, as one stream at a time did."""
    from tests.helpers.cluster_util import local_cluster

    with local_cluster(make_server, masters=3) as formed:
        c = formed.client
        names = [name(i) for i in range(40)]
        for i, stream in enumerate(names):
            for j in range(jobs(i)):
                c.xadd(stream, {"d": f"{i}-{j}".encode()})
            c.xgroup_create(stream, "work", id="0")
            if held(i):
                c.xreadgroup("work", "c0", {stream: ">"}, count=held(i))
            if i % 7 == 0:
                c.xadd(StreamKeys.for_stream(stream).dead, {"reason": "declined"})
        with Producer.from_url(formed.url, partitions=3) as p3:
            p3.send_many("events", [{"j": j} for j in range(6)],
                         keys=[f"k{j}" for j in range(6)])
        client = connection.sync_client(formed.url)
        try:
            got = {s.stream: s for s in stats.sample(client, names)}
            for i, stream in enumerate(names):
                s, work = got[stream], got[stream].group("work")
                assert work is not None
                assert (s.length, s.dead, work.lag, work.pending) == (
                    jobs(i), 1 if i % 7 == 0 else 0, jobs(i) - held(i), held(i)), stream
            events = partitioned_stats(client, "events", 3)
            assert events.length == 6 and all(p.node for p in events.partitions)
            assert len({p.node for p in events.partitions}) > 1
            shown = {s.stream: s for s in data.snapshot(client)}
            assert sorted(shown) == sorted([*names, "events"])
            assert shown["events"].length == 6
        finally:
            client.close()


def test_a_job_lookup_keeps_the_page(web: TestClient) -> None:
    """The lookup form carries the page, filter and order along: the answer comes on the
    same list of streams."""
    html = web.get("/?q=s-01&sort=lag&page=1").text
    form = html.split('<section class="card" id="job">', 1)[1].split("</form>", 1)[0]
    assert '<input type="hidden" name="q" value="s-01">' in form
    assert '<input type="hidden" name="sort" value="lag">' in form
    shown = page_streams(html)
    looked = web.get(f"/?q=s-01&sort=lag&job_stream={name(150)}&job_key=nope").text
    assert page_streams(looked) == shown and 'id="job-result"' in looked
