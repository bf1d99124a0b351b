"""Job priorities: ``send(..., priority="high")`` puts a job on its level's stream, workers
read the levels in ``strict`` or ``weighted`` order, and every level shares the group's job
records (dedup, status, cancel), dead letters, replay and reclaim. Real Redis throughout."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._ops.deadletter import list_dead, replay_dead
from streamwork._wire.codec import decode_body
from streamwork._wire.keys import StreamKeys
from streamwork._wire.priorities import level_stream
from streamwork._worker.core.consumer import max_held
from streamwork._worker.features.priorities import DISCOVER_EVERY
from streamwork.testing import Ledger, await_for, run_until_idle, wait_for
from tests.helpers.serving import serving
from tests.workers.ledger import STREAM

GROUP = "prio"
HIGH = level_stream(StreamKeys.for_stream(STREAM), "high")
LOW = level_stream(StreamKeys.for_stream(STREAM), "low")


class Starts(sw.StreamWorker):
    """Records the order in which handlers start (in this process), as (level, key)."""

    stream = STREAM
    group = GROUP
    concurrency = 4
    batch_size = 50
    read_block = 0.05
    visibility_timeout = 10.0
    retry_delay = 0.05
    retry_max_delay = 0.2
    max_deliveries = 3
    dedup_window = 600.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started: list[tuple[str, str]] = []
        self.fixed: set[str] = set()

    async def handle(self, msg: sw.Message) -> str:
        self.started.append((msg.priority, msg.key))
        if msg.payload.get("dead") and msg.key not in self.fixed:
            raise sw.DeadLetter("asked to")
        await asyncio.sleep(float(msg.payload.get("sleep", 0.0)))
        return f"{msg.key} at {msg.priority}"


def starts_worker(redis_url: str, **options: Any) -> Starts:
    return Starts.from_url(redis_url, **options)


# ---- checks --------------------------------------------------------------------------


def test_bad_priorities_are_refused_with_the_allowed_values(redis_url: str) -> None:
    with sw.Producer.from_url(redis_url) as p:
        for bad in ("urgent", "HIGH", 0, ""):
            with pytest.raises(sw.ConfigError) as err:
                p.send(STREAM, {}, priority=bad)  # type: ignore[arg-type]
            assert "'high', 'normal', 'low'" in str(err.value)
            with pytest.raises(sw.ConfigError):
                p.send_many(STREAM, [{}], priority=bad)  # type: ignore[arg-type]
        with pytest.raises(sw.ConfigError, match="delayed jobs"):
            p.send(STREAM, {}, priority="high", delay=5)
    with sw.Producer.from_url(redis_url, partitions=4) as p, \
            pytest.raises(sw.ConfigError, match="partitioned"):
        p.send(STREAM, {}, priority="low")
    for options, match in (({"priority_order": "fifo"}, "strict"),
                           ({"priority_weights": "8:2"}, "8:2:1"),
                           ({"priority_weights": "8:0:1"}, "from 1 to 1000"),
                           ({"ordered": True, "priority_order": "weighted"}, "ordered")):
        with pytest.raises(sw.ConfigError, match=match):
            starts_worker(redis_url, **options)
    with pytest.raises(sw.ConfigError, match="keeps for another stream"):
        sw.Producer.from_url(redis_url).send(HIGH, {})
    assert redis.Redis.from_url(redis_url).dbsize() == 0, "nothing was sent"


async def test_the_normal_level_adds_no_key_and_no_round_trip_per_batch(
        r: redis.Redis, redis_url: str) -> None:
    """Without priorities the worker reads with one XREADGROUP per batch, as before: no
    level keys appear, and the look for levels costs one EXISTS a second, not one per
    batch (the test waits on the worker's own counters, so Redis counts only its calls)."""
    n = 3000
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{}] * n)
    r.config_resetstat()
    worker = starts_worker(redis_url, batch_size=20, concurrency=8)
    began = time.monotonic()
    async with serving(worker):
        await await_for(lambda: worker.counts["acked"] == n, timeout=60,
                        message=f"{n} jobs acknowledged")
        elapsed = time.monotonic() - began
        stats = r.info("commandstats")
    reads = stats.get("cmdstat_xreadgroup", {}).get("calls", 0)
    exists = stats.get("cmdstat_exists", {}).get("calls", 0)
    print(f"\nnormal level only: {n} jobs in {elapsed:.2f}s, {reads} XREADGROUP "
          f"(batches of 20: {n // 20}), {exists} EXISTS; level keys: {r.keys('*:p:*')}")
    assert len(worker.started) == n
    assert all(level == "normal" for level, _ in worker.started)
    assert r.keys("*:p:*") == []
    assert n // 20 <= reads
    assert exists <= 2 + elapsed / DISCOVER_EVERY, stats


# ---- order ---------------------------------------------------------------------------


async def test_strict_order_starts_high_jobs_before_the_next_batch_of_low_ones(
        r: redis.Redis, redis_url: str) -> None:
    """10,000 low jobs are being worked through; 100 high ones are sent: every high job
    starts before the low ones read after the send (only what the worker already held,
    at most max_held, may start in between)."""
    worker = starts_worker(redis_url, concurrency=4, batch_size=50)
    async with sw.AsyncProducer.from_url(redis_url) as p:
        await p.send_many(STREAM, [{"sleep": 0.002}] * 10_000,
                          keys=[f"low-{i}" for i in range(10_000)], priority="low")
        async with serving(worker):
            await await_for(lambda: len(worker.started) >= 300, timeout=60,
                            message="300 low jobs to start")
            sent_at = len(worker.started)
            await p.send_many(STREAM, [{"sleep": 0.002}] * 100,
                              keys=[f"high-{i}" for i in range(100)], priority="high")
            await await_for(lambda: sum(lv == "high" for lv, _ in worker.started) == 100,
                            timeout=60, message="the 100 high jobs to start")
            started = list(worker.started)
    high_at = [i for i, (lv, _) in enumerate(started) if lv == "high"]
    low_between = sum(lv == "low" for lv, _ in started[sent_at:high_at[-1]])
    bound = max_held(4, 50)
    print(f"\nstrict: high sent after {sent_at} low starts; high starts at positions "
          f"{high_at[0]}..{high_at[-1]}; {low_between} low jobs started between the high "
          f"sends and the last high start (bound {bound}: what the worker already held); "
          f"{len(started)} starts in all")
    assert len(high_at) == 100
    assert low_between <= bound
    # once the high ones begin, they run back to back: no low batch is read in between
    assert sum(lv == "low" for lv, _ in started[high_at[0]:high_at[-1]]) <= bound
    assert len(started) < 10_000, "the low backlog was not simply drained first"


async def test_weighted_order_keeps_serving_the_low_level(
        r: redis.Redis, redis_url: str) -> None:
    """Both levels backlogged: with weights 8:2:1 the low level gets about its share of
    every read round (never starved); with strict order it gets none meanwhile."""
    n, first = 2000, 1000
    figures = {}
    for order in ("weighted", "strict"):
        r.flushall()
        with sw.Producer.from_url(redis_url) as p:
            p.send_many(STREAM, [{}] * n, keys=[f"high-{i}" for i in range(n)],
                        priority="high")
            p.send_many(STREAM, [{}] * n, keys=[f"low-{i}" for i in range(n)],
                        priority="low")
        worker = starts_worker(redis_url, concurrency=4, batch_size=20,
                               priority_order=order, priority_weights="8:2:1")
        async with serving(worker):
            await await_for(lambda w=worker: len(w.started) >= first, timeout=60,
                            message=f"{first} starts")
        figures[order] = sum(lv == "low" for lv, _ in worker.started[:first]) / first
    weight_share = 1 / 11
    print(f"\nweighted 8:2:1: low share of the first {first} starts {figures['weighted']:.3f} "
          f"(weight share {weight_share:.3f}); strict: {figures['strict']:.3f}")
    assert figures["weighted"] >= weight_share - 0.04
    assert figures["weighted"] <= 0.5
    assert figures["strict"] <= max_held(4, 20) / first


# ---- one job across levels ------------------------------------------------------------


async def test_a_key_sent_at_two_levels_runs_once(r: redis.Redis, redis_url: str) -> None:
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="twice", priority="low")
        p.send(STREAM, {}, key="twice", priority="high")
        p.send(STREAM, {}, key="twice")
        p.send_many(STREAM, [{}] * 10, keys=[f"other-{i}" for i in range(10)],
                    priority="high")
        worker = starts_worker(redis_url)
        await run_until_idle(worker, r, timeout=60)
        assert [k for _, k in worker.started].count("twice") == 1, worker.started
        st = p.status(STREAM, "twice", group=GROUP)
        assert st.state == "done"
        assert p.result(STREAM, "other-3", group=GROUP) == "other-3 at high"
    assert worker.counts["deduplicated"] == 2
    assert r.xlen(HIGH) == 11 and r.xlen(LOW) == 1


async def test_cancel_and_status_of_high_jobs(r: redis.Redis, redis_url: str) -> None:
    async with sw.AsyncProducer.from_url(redis_url) as p:
        await p.send(STREAM, {}, key="keep", priority="high")
        await p.send(STREAM, {}, key="drop", priority="high")
        assert (await p.status(STREAM, "drop", group=GROUP)).state == "unknown"
        await p.cancel(STREAM, "drop", group=GROUP, reason="not needed")
        worker = starts_worker(redis_url)
        await run_until_idle(worker, r, timeout=60)
        assert [k for _, k in worker.started] == ["keep"]
        assert (await p.status(STREAM, "drop", group=GROUP)).state == "cancelled"
        st = await p.status(STREAM, "keep", group=GROUP)
        assert (st.state, st.result) == ("done", "keep at high")


async def test_a_failing_high_job_dead_letters_and_replays_at_high(
        r: redis.Redis, redis_url: str) -> None:
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"dead": True}, key="poison", priority="high")
        worker = starts_worker(redis_url)
        await run_until_idle(worker, r, timeout=60)
        [dead] = list_dead(r, STREAM)
        assert dead.reason == "dead_letter" or dead.reason, dead
        body = r.xrange(StreamKeys.for_stream(STREAM).dead)[0][1][b"f.d"]
        assert decode_body(body).options["priority"] == "high"
        assert p.status(STREAM, "poison", group=GROUP).state == "dead"
        assert replay_dead(r, STREAM)[0] == 1
        worker = starts_worker(redis_url)
        worker.fixed.add("poison")
        await run_until_idle(worker, r, timeout=60)
        assert worker.started == [("high", "poison")]
        assert p.result(STREAM, "poison", group=GROUP) == "poison at high"


async def test_a_killed_workers_high_deliveries_are_reclaimed(
        r: redis.Redis, redis_url: str,
        spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """A worker process holding high jobs (2 running, 100 read ahead) is SIGKILLed:
    another worker takes them back from the high stream; every job takes effect once."""
    blockers = ["blocker-0", "blocker-1"]
    rest = [f"job-{i}" for i in range(100)]
    lows = [f"low-{i}" for i in range(20)]
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{"first_sleep": 60}] * 2, keys=blockers, priority="high")
        p.send_many(STREAM, [{}] * len(rest), keys=rest, priority="high")
        p.send_many(STREAM, [{}] * len(lows), keys=lows, priority="low")
    proc = spawn_worker("tests.workers.recording:RecordingWorker", redis_url,
                        "--concurrency", "2", "--batch-size", "102",
                        "--visibility-timeout", "1", "--read-block", "0.1")

    def held() -> int:
        try:
            return int(r.xpending(HIGH, "testers")["pending"])
        except redis.ResponseError:  # its group is not created yet
            return 0

    wait_for(lambda: held() == 102, timeout=30,
             message="the worker to hold 2 running and 100 read-ahead high jobs")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    from tests.workers.recording import RecordingWorker
    worker = RecordingWorker.from_url(redis_url, concurrency=8, batch_size=100,
                                      visibility_timeout=1.0, reclaim_interval=0.2)
    await run_until_idle(worker, r, timeout=60)
    report = Ledger(r).report(blockers + rest + lows)
    print(f"\nreclaimed {worker.counts['reclaimed']} high deliveries; lost {report.lost}, "
          f"twice {report.twice}")
    assert report.exactly_once
    assert worker.counts["reclaimed"] >= 102


# ---- operators' view -------------------------------------------------------------------


async def test_inspect_counts_every_level(r: redis.Redis, redis_url: str) -> None:
    """A group's lag and pending include its jobs waiting at high and low; ``streamwork
    send --priority`` sends at a level."""
    from click.testing import CliRunner

    from streamwork._cli.main import main
    from streamwork._ops.stats import stream_stats

    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, priority="high")
        p.send(STREAM, {}, priority="low")
        await run_until_idle(starts_worker(redis_url), r, timeout=60)  # joins every level
        p.send_many(STREAM, [{}] * 3, priority="high")
        p.send_many(STREAM, [{}] * 4)
    res = CliRunner().invoke(main, ["send", STREAM, "{}", "--priority", "low", "--url",
                                    redis_url])
    assert res.exit_code == 0, res.output
    bad = CliRunner().invoke(main, ["send", STREAM, "{}", "--priority", "urgent", "--url",
                                    redis_url])
    assert bad.exit_code != 0 and "high" in bad.output
    g = stream_stats(r, STREAM).group(GROUP)
    assert g is not None
    # seen once in a loaded CI run: {'high': 0, 'low': 1}; say who had read the high stream
    assert g.priority_lag == {"high": 3, "low": 1}, (
        r.xinfo_groups(HIGH), [r.xinfo_consumers(HIGH, x["name"]) for x in r.xinfo_groups(HIGH)],
        r.xlen(HIGH))
    assert g.lag == 8 and g.pending == 0


async def test_a_batch_handler_gets_the_high_jobs_first(r: redis.Redis, redis_url: str) -> None:
    """Batch handlers read the levels as plain handlers do: with both levels backlogged,
    the first calls hold only high jobs."""
    calls: list[list[str]] = []

    class Bulk(sw.StreamWorker):
        stream = STREAM
        group = GROUP
        concurrency = 1
        batch_size = 20
        batch_max = 20
        read_block = 0.05

        async def handle_batch(self, msgs: list[sw.Message]) -> None:
            calls.append([m.priority for m in msgs])

    with sw.Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{}] * 200, priority="low")
        p.send_many(STREAM, [{}] * 60, priority="high")
    await run_until_idle(Bulk.from_url(redis_url), r, timeout=60)
    levels = [lv for call in calls for lv in call]
    print(f"\nbatch handler: {len(calls)} calls; first high-only calls "
          f"{[len(c) for c in calls[:4]]}; last high job at {levels.index('low') - 1}")
    assert len(levels) == 260
    assert levels[:60] == ["high"] * 60


@pytest.mark.cluster
async def test_levels_on_redis_cluster(make_server: Any) -> None:
    """On a 3-master Cluster the level streams share the stream's slot: every script
    (read.lua over all levels included) runs without CROSSSLOT, and each job of each level
    takes effect once, retries (through the retry stream) included."""
    from tests.helpers.cluster_util import local_cluster

    class Ledger3(sw.StreamWorker):
        stream = "orders"
        group = "testers"
        read_block = 0.1
        retry_delay = 0.05
        retry_max_delay = 0.5

        async def handle(self, msg: sw.Message) -> None:
            if msg.attempt == 1 and msg.key.endswith("7"):
                raise RuntimeError("flaky once")
            msg.stage("HINCRBY", ["{orders}:ledger"], [msg.key, 1])

    with local_cluster(make_server, masters=3) as formed:
        url = f"redis+cluster://{formed.client.get_default_node().name}"
        with sw.Producer.from_url(url) as p:
            for level in ("high", "normal", "low"):
                p.send_many("orders", [{}] * 30, keys=[f"{level}-{i}" for i in range(30)],
                            priority=level)
        worker = Ledger3.from_url(url)
        await run_until_idle(worker, formed.client, timeout=60)
        ledger = formed.client.hgetall("{orders}:ledger")
        assert len(ledger) == 90 and set(ledger.values()) == {b"1"}
        assert worker.counts["retried"] == 9


async def test_an_ordered_worker_says_it_leaves_other_levels_unread(
        r: redis.Redis, redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Ordered mode reads the stream alone: a job sent at high is left unread, and the
    worker says so once, in an error line naming what to do."""
    import logging

    caplog.set_level(logging.ERROR, logger="streamwork.worker")
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="in-order")
        p.send(STREAM, {}, key="urgent", priority="high")
    worker = starts_worker(redis_url, ordered=True)
    async with serving(worker):
        await await_for(lambda: worker.started == [("normal", "in-order")], timeout=30,
                        message="the normal job to run")
        await await_for(lambda: any("priority" in rec.getMessage() for rec in caplog.records),
                        timeout=30, message="the error line")
    lines = [rec.getMessage() for rec in caplog.records if "priority" in rec.getMessage()]
    assert len(lines) == 1 and "without priority=" in lines[0], lines
    assert r.xlen(HIGH) == 1 and worker.started == [("normal", "in-order")]


async def test_weighted_order_serves_every_level_even_one_entry_a_read(
        redis_url: str, r: redis.Redis) -> None:
    """concurrency 1 and a batch of 1: each read has room for one entry. With backlogs on
    every level, weighted 8:2:1 still starts each level in turn, by weight (low about
    1 in 11), not high until it drains."""
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{}] * 120, keys=[f"h{i}" for i in range(120)], priority="high")
        p.send_many(STREAM, [{}] * 60, keys=[f"n{i}" for i in range(60)])
        p.send_many(STREAM, [{}] * 40, keys=[f"l{i}" for i in range(40)], priority="low")
    w = starts_worker(redis_url, concurrency=1, batch_size=1, priority_order="weighted")
    async with serving(w):
        await await_for(lambda: len(w.started) >= 110, timeout=60, message="110 starts")
    first = [level for level, _ in w.started[10:110]]  # once every level was discovered
    counts = {level: first.count(level) for level in ("high", "normal", "low")}
    assert counts["low"] >= 5 and counts["normal"] >= 10, counts
    assert counts["high"] > counts["normal"] > counts["low"], counts


async def test_replayed_low_jobs_do_not_overtake_a_high_one(redis_url: str,
                                                            r: redis.Redis) -> None:
    """300 low jobs dead-lettered, then replayed (they come back on the group's retry
    stream), and a high job sent right after the replay: it starts before the replays,
    bar what the worker read in its first read (retries are read after the high level)."""
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{"dead": True}] * 300, keys=[f"r{i}" for i in range(300)],
                    priority="low")
        w = starts_worker(redis_url, max_deliveries=1)
        await run_until_idle(w, r, timeout=60)
        assert r.xlen(StreamKeys.for_stream(STREAM).dead) == 300
        assert replay_dead(r, STREAM)[0] == 300
        p.send(STREAM, {}, key="urgent", priority="high")
        again = starts_worker(redis_url, max_deliveries=1)
        again.fixed.update(f"r{i}" for i in range(300))
        await run_until_idle(again, r, timeout=60)
    keys = [key for _, key in again.started]
    assert len(keys) == 301
    assert keys.index("urgent") < again.config.batch_size, keys[:60]
