"""Lag counts what waits on a group's own side: replayed dead letters on its retry stream
and due retries not yet promoted, in ``inspect`` (tables, ``--json``, ``--fail-if``),
``top``, the dashboard's figures and the stream gauges; partitioned streams add it up."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
import redis

import tests.test_cli_partitions as partitioned
from streamwork import Producer
from streamwork._dashboard.data import snapshot
from streamwork._redis import connection
from streamwork._telemetry import api as telemetry
from streamwork._wire.keys import StreamKeys
from streamwork._worker.core.consumer import Consumer
from streamwork._worker.core.loops import gauges
from streamwork._worker.features import FEATURES
from streamwork.testing import Ledger, await_for, run_until_idle
from tests.helpers.cluster_util import local_cluster
from tests.test_cli_ops import cli, row
from tests.test_deadletter import FIX, GROUP, KEYS, STREAM, _make_dead
from tests.workers.recording import RecordingWorker, calls

N = 25  #: jobs dead-lettered, then replayed


def inspect_group(url: str, *extra: str) -> dict[str, Any]:
    """The group's figures in `inspect jobs --json`."""
    out = cli("inspect", STREAM, "--json", *extra, "--url", url)
    assert out.exit_code == 0, out.output
    [g] = [g for g in json.loads(out.stdout)["groups"] if g["name"] == GROUP]
    return g


def top_lag(url: str) -> str:
    """The lag cell of the group's row in one frame of `top --once`."""
    out = cli("top", STREAM, "--once", "--interval", "0.2", "--url", url)
    assert out.exit_code == 0, out.output
    return row(out.stdout, f"{STREAM}/{GROUP}")[1]


async def gauge(url: str, what: str) -> float | None:
    """The gauge's value for the group after one read by the function the gauges loop runs
    (None: not reported)."""
    labels = (what, STREAM, GROUP if what in ("lag", "pending") else "")
    telemetry._board.values.pop(labels, None)
    worker = RecordingWorker.from_url(url)
    consumer = Consumer(worker.handle, worker.config, worker.url, "probe",
                        features=FEATURES)
    try:
        await gauges.read_gauges(consumer.ctx)
    finally:
        await consumer.redis.aclose()
    return telemetry._board.values.get(labels)


def dashboard_lag(url: str) -> int | None:
    """The group's lag as the dashboard reads it."""
    client = connection.sync_client(url)
    try:
        [s] = [s for s in snapshot(client) if s.stream == STREAM]
    finally:
        client.close()
    g = s.group(GROUP)
    assert g is not None
    return g.lag


def fail_if(url: str, expr: str) -> Any:
    return cli("inspect", STREAM, "-q", "--fail-if", expr, "--url", url)


async def test_replayed_dead_letters_count_as_lag_until_a_worker_runs_them(
        redis_url: str, r: redis.Redis) -> None:
    """Dead letters replayed with no worker running wait on the group's retry stream: lag N
    in inspect --json, top, the dashboard and the lag gauge, and `--fail-if 'lag>0'` fails;
    once a worker has run them, lag is 0 everywhere again."""
    await _make_dead(r, redis_url, N)
    r.set(FIX, 1)
    replayed = cli("dlq", "replay", STREAM, "--all", "--url", redis_url)
    assert replayed.exit_code == 0, replayed.output
    assert f"replayed {N}, skipped 0" in replayed.output
    assert r.xlen(KEYS.group(GROUP).retry) == N, "a replay goes to the group's retry stream"

    g = inspect_group(redis_url)
    assert g["lag"] == N, "replays waiting on the retry stream are lag"
    assert (g["retry_lag"], g["retries_due"], g["pending"]) == (N, 0, 0)
    crossed = fail_if(redis_url, "lag>0")
    assert crossed.exit_code == 2, crossed.output
    assert crossed.stderr.splitlines() == [f"FAIL {STREAM}/{GROUP}: lag {N} > 0"]
    assert top_lag(redis_url) == str(N)
    assert dashboard_lag(redis_url) == N
    assert await gauge(redis_url, "lag") == N

    # 3 handed to a consumer that then stops: pending, no longer lag (a worker reclaims
    # them after its visibility timeout)
    r.xreadgroup(GROUP, "gone", {KEYS.group(GROUP).retry: ">"}, count=3)
    g = inspect_group(redis_url)
    assert (g["lag"], g["pending"]) == (N - 3, 3)
    assert await gauge(redis_url, "lag") == N - 3
    assert await gauge(redis_url, "pending") == 3

    await run_until_idle(RecordingWorker.from_url(redis_url), r, timeout=60)
    assert set(Ledger(r).counts()) == {f"dl-{i}" for i in range(N)}
    g = inspect_group(redis_url)
    assert (g["lag"], g["pending"]) == (0, 0)
    assert g["retry_lag"] == 0
    assert fail_if(redis_url, "lag>0").exit_code == 0
    assert top_lag(redis_url) == "0"
    assert dashboard_lag(redis_url) == 0
    assert await gauge(redis_url, "lag") == 0


class SlowRetry(RecordingWorker):
    """Lets a handler's Retry(delay=600) stand: the retry waits 10 minutes."""

    retry_max_delay = 600.0


async def test_a_due_retry_not_yet_promoted_counts_as_lag(redis_url: str,
                                                          r: redis.Redis) -> None:
    """A retry still in its backoff is not lag (it is `retries_waiting` and `delayed`);
    once due, it waits in the group's retry ZSET until a worker promotes it: with none
    running it is lag (`retries_due`) in inspect, --fail-if, top, the dashboard and the
    gauge, and 0 again once a worker has run it."""
    with Producer.from_url(redis_url) as producer:
        producer.send(STREAM, {"retry_until": 2, "retry_delay": 600}, key="later")
    worker = SlowRetry.from_url(redis_url)
    task = asyncio.create_task(worker.serve())
    try:
        await await_for(lambda: worker.counts["retried"] == 1, message="one retry scheduled")
    finally:
        worker.stop()
        await task
    g = inspect_group(redis_url)
    assert (g["lag"], g["retries_waiting"], g["pending"]) == (0, 1, 0)
    assert g.get("retries_due", 0) == 0  # (a field the base code does not have)
    assert fail_if(redis_url, "lag>0").exit_code == 0
    assert await gauge(redis_url, "lag") == 0

    retries = KEYS.group(GROUP).retries  # its backoff is over, as if 10 minutes had passed
    [member] = r.zrange(retries, 0, -1)
    r.zadd(retries, {member: 0}, xx=True)
    g = inspect_group(redis_url)
    assert g["lag"] == 1, "a due retry waiting for promotion is lag"
    assert (g["retry_lag"], g["retries_due"], g["retries_waiting"]) == (0, 1, 1)
    crossed = fail_if(redis_url, "lag>0")
    assert crossed.exit_code == 2, crossed.output
    assert crossed.stderr.splitlines() == [f"FAIL {STREAM}/{GROUP}: lag 1 > 0"]
    assert top_lag(redis_url) == "1"
    assert dashboard_lag(redis_url) == 1
    assert await gauge(redis_url, "lag") == 1
    assert await gauge(redis_url, "delayed") == 1, "the delayed gauge counts it, as inspect"

    await run_until_idle(RecordingWorker.from_url(redis_url), r, timeout=60)
    assert [attempt for attempt, _ in calls(r, "later")] == [1, 2]
    g = inspect_group(redis_url)
    assert (g["lag"], g["retries_waiting"]) == (0, 0)
    assert g["retries_due"] == 0
    assert fail_if(redis_url, "lag>0").exit_code == 0
    assert top_lag(redis_url) == "0"
    assert dashboard_lag(redis_url) == 0
    assert await gauge(redis_url, "lag") == 0


async def test_partitioned_stream_adds_up_each_partitions_replays(redis_url: str,
                                                                 r: redis.Redis) -> None:
    """Dead letters of every partition replayed with no worker running: `inspect
    --partitions 4` shows each partition's own lag (its replays) and their sum, and
    `--fail-if` fails on it; a worker runs them and the sum is 0."""
    await partitioned.run_first(redis_url, r)
    partitioned.FIXED["on"] = True
    out = partitioned.cli("dlq", "replay", partitioned.STREAM, "--partitions", "4", "--all",
                          "--url", redis_url)
    assert out.exit_code == 0, out.output
    bad = len(partitioned.BAD)

    def doc() -> dict[str, Any]:
        res = partitioned.cli("inspect", partitioned.STREAM, "--partitions", "4", "--json",
                              "--url", redis_url)
        assert res.exit_code == 0, res.output
        return dict(json.loads(res.stdout))

    d = doc()
    per = [p["stats"]["groups"][0] for p in d["partitions"]]
    retry = [StreamKeys.for_stream(name).group(partitioned.GROUP).retry
             for name in partitioned.NAMES]
    assert [g["lag"] for g in per] == [r.xlen(k) for k in retry]
    assert all(g["lag"] > 0 for g in per), "dead letters were in every partition"
    assert d["groups"][0]["lag"] == sum(g["lag"] for g in per) == bad
    assert d["groups"][0]["retry_lag"] == bad
    crossed = partitioned.cli("inspect", partitioned.STREAM, "--partitions", "4", "-q",
                              "--fail-if", "lag>0", "--url", redis_url)
    assert crossed.exit_code == 2, crossed.output
    assert crossed.stderr.splitlines() == [
        f"FAIL {partitioned.STREAM}/{partitioned.GROUP}: lag {bad} > 0"]

    await run_until_idle(partitioned.SplitWorker.from_url(redis_url), r, timeout=60)
    d = doc()
    assert d["groups"][0]["lag"] == 0
    assert [p["stats"]["groups"][0]["lag"] for p in d["partitions"]] == [0, 0, 0, 0]


def test_lag_the_retry_stream_cannot_tell_is_unknown(redis_url: str, r: redis.Redis) -> None:
    """An entry deleted past the group's position on its retry stream makes Redis unable to
    tell that stream's lag: the group's lag is unknown (null, a WARN for --fail-if), as when
    the stream itself cannot tell, and not a figure that leaves those entries out."""
    g = KEYS.group(GROUP)
    r.xgroup_create(STREAM, GROUP, "0", mkstream=True)
    r.xgroup_create(g.retry, GROUP, "0", mkstream=True)
    ids = [r.xadd(g.retry, {"d": b"x"}) for _ in range(5)]
    r.xreadgroup(GROUP, "c", {g.retry: ">"}, count=2)
    r.xdel(g.retry, ids[3])
    out = cli("inspect", STREAM, "--json", "--fail-if", "lag>0", "--url", redis_url)
    assert out.exit_code == 0, out.output
    [doc] = json.loads(out.stdout)["groups"]
    assert (doc["lag"], doc["pending"]) == (None, 2)
    assert doc["retry_lag"] is None
    assert out.stderr.startswith(f"WARN {STREAM}/{GROUP}: Redis cannot tell this group's lag")


def test_a_retry_stream_without_the_group_counts_whole(redis_url: str, r: redis.Redis) -> None:
    """Entries on a group's retry stream before its consumer group exists there (workers
    create it at id 0 when they start): all of them will reach the group, so all are lag."""
    r.xgroup_create(STREAM, GROUP, "0", mkstream=True)
    for _ in range(3):
        r.xadd(KEYS.group(GROUP).retry, {"d": b"x"})
    g = inspect_group(redis_url)
    assert g["lag"] == 3
    assert g["retry_lag"] == 3


def test_retry_side_from_replies() -> None:
    """The figures of a group's side from raw replies: no retry stream, no group there,
    its reported lag, and a null lag (unknown unless the retry stream is empty)."""
    from streamwork._ops.stats import RetrySide, retry_side

    missing = redis.ResponseError("no such key")
    assert retry_side("g", missing, 0, 2, 1) == RetrySide(lag=0, pending=0, waiting=2, due=1)
    other = [{"name": b"h", "lag": 9, "pending": 9}]
    assert retry_side("g", other, 4, 0, 0) == RetrySide(lag=4)
    mine = [*other, {"name": b"g", "lag": 3, "pending": 1}]
    assert retry_side("g", mine, 4, 0, 0) == RetrySide(lag=3, pending=1)
    assert retry_side("g", [{"name": "g", "lag": None, "pending": 0}], 0, 0, 0).lag == 0
    unknown = retry_side("g", [{"name": "g", "lag": None, "pending": 0}], 5, 0, 1)
    assert unknown.lag is None and unknown.total_lag(0) is None
    assert RetrySide(lag=2, due=1).total_lag(4) == 7
    assert RetrySide(lag=2).total_lag(None) is None


def test_dashboard_page_shows_the_retry_lag(redis_url: str, r: redis.Redis) -> None:
    """The dashboard's group row shows the replays waiting on the retry stream as lag, and
    says in the cell's title where that lag waits."""
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    pytest.importorskip("jinja2", reason="the dashboard extra is not installed")
    from starlette.testclient import TestClient

    from streamwork._dashboard.app import DashboardSettings, create_app

    r.xgroup_create(STREAM, GROUP, "0", mkstream=True)
    r.xgroup_create(KEYS.group(GROUP).retry, GROUP, "0", mkstream=True)
    for _ in range(4):  # what `dlq replay` adds there
        r.xadd(KEYS.group(GROUP).retry, {"d": b"x"})
    settings = DashboardSettings(redis_url, refresh_s=0, sample_interval_s=60)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        page = client.get("/")
    assert page.status_code == 200, page.text
    cell = re.search(r'<tr data-group="testers">.*?<td class="num[^"]*" data-metric="lag"'
                     r'([^>]*)>([^<]*)</td>', page.text, re.S)
    assert cell is not None, page.text
    assert cell[2] == "4"
    assert 'title="of which 4 on its retry stream' in cell[1]


async def test_on_a_cluster_inspect_and_the_gauge_count_the_retry_side(
        make_server: Any) -> None:
    """On a Cluster URL the retry side is read in one pipeline on the stream's slot: two
    replays waiting on the retry stream and one due retry are lag 3 in inspect and in the
    gauge, and a handed-out replay is pending in both."""
    with local_cluster(make_server, masters=3) as formed:
        client = formed.client
        url = f"redis+cluster://{client.get_default_node().name}"
        g = KEYS.group(GROUP)
        client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        client.xgroup_create(g.retry, GROUP, id="0", mkstream=True)
        for _ in range(3):
            client.xadd(g.retry, {"d": b"x"})
        client.xreadgroup(GROUP, "gone", {g.retry: ">"}, count=1)
        client.zadd(g.retries, {"1:0-1:due": 0, "1:0-2:later": 2**41})
        doc = inspect_group(url)
        assert (doc["lag"], doc["pending"]) == (3, 1)
        assert await gauge(url, "lag") == 3
        assert await gauge(url, "pending") == 1
