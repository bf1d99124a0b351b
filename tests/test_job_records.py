"""Per-group job records: fan-out to two groups, retries and replays that reach
only their group, job status through a job's life, result() across processes, the
max_result_bytes cap, the local cache option, and `streamwork job`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from typing import Any

import cachetools
import pytest
import redis
from click.testing import CliRunner

import streamwork as sw
from streamwork._cli.main import main
from streamwork._ops.deadletter import replay_dead
from streamwork._wire.keys import StreamKeys
from streamwork.testing import Ledger, await_for, run_until_idle, stream_idle
from tests.helpers.serving import serving
from tests.workers.records import STREAM, RecordsWorker, ledger_name, runs_key

S = STREAM
GROUPS = ("billing", "mailer")
KEYS = StreamKeys.for_stream(S)


def runs(r: redis.Redis, group: str, key: str) -> list[int]:
    """The attempt numbers of every run of ``key``'s handler in ``group``, in order."""
    return [int(a) for a in r.lrange(runs_key(group, key), 0, -1)]


def ledger(r: redis.Redis, group: str) -> dict[str, int]:
    return Ledger(r, ledger_name(group)).counts()


async def serve_groups(url: str, r: redis.Redis, **options: Any) -> dict[str, RecordsWorker]:
    """One worker per group on the stream, all served until every group is idle."""
    workers = {g: RecordsWorker.from_url(url, group=g, **options) for g in GROUPS}
    await asyncio.gather(*(run_until_idle(w, r) for w in workers.values()))
    return workers


async def until_idle(r: redis.Redis, group: str = "billing") -> None:
    await await_for(lambda: stream_idle(r, S, group), 15,
                    message=f"group {group!r} to be idle")


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


# ---- 1. two groups on one stream -------------------------------------------------------

@pytest.mark.parametrize("dedup", [True, False], ids=["dedup-on", "dedup-off"])
async def test_two_groups_each_run_every_job_and_retries_and_replays_stay_in_their_group(
    redis_url: str, r: redis.Redis, dedup: bool
) -> None:
    """Fan-out: billing and mailer each run all 10 jobs once. A job that fails once in
    billing runs twice there (attempt 1 fails, attempt 2 succeeds) and once in mailer. A
    job billing dead-letters, replayed with `streamwork dlq replay`, runs again in billing
    only: nothing is re-added to the shared stream, mailer gets nothing."""
    producer = sw.Producer.from_url(redis_url)
    keys = [f"order-{i}" for i in range(10)]
    producer.send_many(S, [{}] * len(keys), keys=keys)
    await serve_groups(redis_url, r, dedup=dedup)
    for group in GROUPS:
        report = Ledger(r, ledger_name(group)).report(keys)
        assert report.exactly_once and report.applied == 10, (group, report)
        assert all(runs(r, group, k) == [1] for k in keys), group

    # a failure and its retry in billing
    producer.send(S, {"fail_once_in": "billing"}, key="flaky")
    workers = await serve_groups(redis_url, r, dedup=dedup)
    assert runs(r, "billing", "flaky") == [1, 2]
    assert runs(r, "mailer", "flaky") == [1]
    assert ledger(r, "billing")["flaky"] == 1 and ledger(r, "mailer")["flaky"] == 1
    assert workers["billing"].counts["retried"] == 1
    assert workers["mailer"].counts["consumed"] == 1
    assert workers["mailer"].counts["retried"] == 0
    assert r.xlen(S) == 11, "a retry must not be added to the shared stream"
    assert r.xlen(KEYS.group("mailer").retry) == 0

    # a dead letter in billing, replayed through the CLI once its cause is fixed
    producer.send(S, {"dead_in": "billing"}, key="doomed")
    await serve_groups(redis_url, r, dedup=dedup)
    [(dead_id, fields)] = r.xrange(KEYS.dead)
    assert fields[b"group"] == b"billing"
    assert runs(r, "billing", "doomed") == [1] and "doomed" not in ledger(r, "billing")
    assert runs(r, "mailer", "doomed") == [1] and ledger(r, "mailer")["doomed"] == 1
    r.set("fixed:doomed", 1)
    out = cli("dlq", "replay", S, "--id", dead_id.decode(), "--url", redis_url)
    assert out.exit_code == 0, out.output
    assert "replayed 1, skipped 0" in out.output
    assert r.xlen(KEYS.dead) == 0
    assert r.xlen(S) == 12, "a replay must not be added to the shared stream"
    workers = await serve_groups(redis_url, r, dedup=dedup)
    assert runs(r, "billing", "doomed") == [1, 1], "the replay runs again, attempts anew"
    assert ledger(r, "billing")["doomed"] == 1
    assert workers["billing"].counts["consumed"] == 1
    assert runs(r, "mailer", "doomed") == [1]
    assert workers["mailer"].counts["consumed"] == 0
    assert workers["mailer"].counts["deduplicated"] == 0, "mailer must not even see it"

    # every group ran every job exactly once in the end
    every = [*keys, "flaky", "doomed"]
    for group in GROUPS:
        report = Ledger(r, ledger_name(group)).report(every)
        assert report.exactly_once, (group, report)

    # job records: per group with dedup on; none at all with dedup off
    billing = producer.status(S, "flaky", group="billing")
    mailer = producer.status(S, "flaky", group="mailer")
    if dedup:
        assert (billing.state, billing.attempts, billing.result["attempt"]) == ("done", 2, 2)
        assert (mailer.state, mailer.attempts, mailer.result["attempt"]) == ("done", 1, 1)
        with pytest.raises(sw.ConfigError, match="group") as info:
            producer.status(S, "flaky")  # two groups: which one?
        assert "billing" in str(info.value) and "mailer" in str(info.value)
    else:
        assert billing.state == mailer.state == "unknown"
        assert not r.keys(KEYS.group("billing").job_prefix + "*")
        assert not r.keys(KEYS.group("mailer").job_prefix + "*")
    producer.close()


# ---- 2. status through a job's life ----------------------------------------------------

class GatedWorker(RecordsWorker):
    """Each attempt's handler says it started, then blocks until the test releases it."""

    retry_delay = 0.5
    retry_max_delay = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.entered = {n: asyncio.Event() for n in (1, 2)}
        self.release = {n: asyncio.Event() for n in (1, 2)}

    async def handle(self, msg: sw.Message) -> dict[str, Any]:
        self.entered[msg.attempt].set()
        await self.release[msg.attempt].wait()
        return self.behave(msg)


async def test_status_goes_unknown_running_waiting_running_done(
    redis_url: str, r: redis.Redis
) -> None:
    """unknown (before and after the send) -> running while the handler blocks -> waiting
    with due time, attempts and the error after a failure -> running attempt 2 -> done with
    the returned dict. A duplicate send of the done key is acked without running (by the
    record: no local cache) and the status still shows the first result."""
    producer = sw.Producer.from_url(redis_url)

    def status() -> sw.JobStatus:
        return producer.status(S, "job-1", group="billing")

    assert status().state == "unknown"
    producer.send(S, {"fail_once_in": "billing"}, key="job-1")
    assert status().state == "unknown"
    worker = GatedWorker.from_url(redis_url)
    before = time.time()
    async with serving(worker):
        await asyncio.wait_for(worker.entered[1].wait(), 10)
        first = status()
        assert (first.state, first.attempts) == ("running", 1)
        assert first.fencing_token and first.fencing_token > 0
        assert first.updated_at is not None and before - 1 <= first.updated_at <= time.time()
        assert not first.finished

        worker.release[1].set()
        waiting = await await_for(lambda: s if (s := status()).state != "running" else None,
                                  10, message="the failed attempt to be recorded")
        assert waiting.state == "waiting", waiting
        assert waiting.attempts == 1
        assert "RuntimeError" in waiting.error and "card declined" in waiting.error
        assert waiting.due is not None and waiting.updated_at is not None
        assert 0.5 <= round(waiting.due - waiting.updated_at, 3) <= 0.625  # retry_delay+25%
        assert not waiting.finished and waiting.result is None

        await asyncio.wait_for(worker.entered[2].wait(), 10)
        second = status()
        assert (second.state, second.attempts) == ("running", 2)
        assert second.fencing_token and second.fencing_token > first.fencing_token
        worker.release[2].set()
        done = await await_for(lambda: s if (s := status()).finished else None, 10,
                               message="the job to finish")
    assert done.state == "done" and done.attempts == 2
    assert done.result == {"key": "job-1", "group": "billing", "attempt": 2,
                           "pid": os.getpid()}
    assert done.result_note == "" and done.error == ""
    assert runs(r, "billing", "job-1") == [1, 2]

    producer.send(S, {"fail_once_in": "billing"}, key="job-1")
    again = RecordsWorker.from_url(redis_url, local_cache=False)
    await run_until_idle(again, r)
    assert again.counts["deduplicated"] == 1 and again.counts["consumed"] == 0
    assert runs(r, "billing", "job-1") == [1, 2], "a duplicate of a done key must not run"
    assert status() == done, "the status must still show the first run's result"
    producer.close()


async def test_dead_job_status_has_reason_and_dead_letter_id_and_replay_runs_it(
    redis_url: str, r: redis.Redis
) -> None:
    """A job whose handler raises DeadLetter: state dead, reason, error, the id of its entry
    in {S}:dead. Replayed once the cause is fixed, it runs (attempt 1 again) to done."""
    producer = sw.Producer.from_url(redis_url)
    producer.send(S, {"dead_in": "billing"}, key="job-9")
    await run_until_idle(RecordsWorker.from_url(redis_url), r)
    st = producer.status(S, "job-9")  # the stream has one group: group= may be left out
    assert st.state == "dead" and st.finished and st.group == "billing"
    assert "card stolen" in st.reason
    assert "DeadLetter" in st.error
    assert st.attempts == 1
    [(dead_id, fields)] = r.xrange(KEYS.dead)
    assert st.dead_letter_id == dead_id.decode()
    assert fields[b"reason"].decode() == st.reason

    r.set("fixed:job-9", 1)
    assert replay_dead(r, S, [st.dead_letter_id]) == (1, 0)
    await run_until_idle(RecordsWorker.from_url(redis_url), r)
    st = producer.status(S, "job-9")
    assert st.state == "done" and st.attempts == 1 and st.dead_letter_id is None
    assert st.result == {"key": "job-9", "group": "billing", "attempt": 1, "pid": os.getpid()}
    assert runs(r, "billing", "job-9") == [1, 1]
    producer.close()


# ---- 3. result() across processes ------------------------------------------------------

async def test_result_across_processes(
    redis_url: str, r: redis.Redis, spawn_worker: Any
) -> None:
    """The worker runs in a child process: result() returns its handler's value (with the
    child's pid in it), raises JobFailed for jobs that died (max_deliveries, DeadLetter),
    and TimeoutError quickly while no worker runs. AsyncProducer.result too."""
    producer = sw.Producer.from_url(redis_url)
    producer.send(S, {}, key="early")
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="early"):
        producer.result(S, "early", group="billing", timeout=0.3)
    # at least the timeout; the upper bound only shows it did not wait on for the job (a
    # loaded 2-core CI machine may stall the poller for a while)
    assert 0.3 <= time.monotonic() - start < 5.0

    proc = spawn_worker("tests.workers.records:RecordsWorker", redis_url)
    expected = {"key": "early", "group": "billing", "attempt": 1, "pid": proc.pid}
    assert producer.result(S, "early", group="billing", timeout=30) == expected

    producer.send_many(S, [{"always_fail_in": "billing"}, {"dead_in": "billing"}],
                       keys=["bad", "doomed"])
    with pytest.raises(sw.JobFailed) as failed:
        producer.result(S, "bad", timeout=30)  # one group: group= may be left out
    st = failed.value.status
    assert st.state == "dead" and st.key == "bad"
    assert st.reason == failed.value.reason == "max_deliveries"
    assert st.attempts == 3 and "always fails" in st.error
    with pytest.raises(sw.JobFailed) as failed:
        producer.result(S, "doomed", group="billing", timeout=30)
    assert failed.value.status.state == "dead"
    assert "card stolen" in failed.value.reason
    dead_ids = {eid.decode() for eid, _ in r.xrange(KEYS.dead)}
    assert len(dead_ids) == 2
    assert st.dead_letter_id in dead_ids and failed.value.dead_letter_id in dead_ids

    async with sw.AsyncProducer.from_url(redis_url) as aproducer:
        await aproducer.send(S, {"fail_once_in": "billing"}, key="async-1")
        value = await aproducer.result(S, "async-1", group="billing", timeout=30)
        assert value == {"key": "async-1", "group": "billing", "attempt": 2, "pid": proc.pid}
        st = await aproducer.status(S, "async-1", group="billing")
        assert st.state == "done" and st.result == value
    assert proc.poll() is None, "the worker process must still run"
    producer.close()


async def test_result_without_group_waits_for_the_first_worker(redis_url: str,
                                                                r: redis.Redis) -> None:
    """result() without group= on a stream that has no consumer group yet (the job was sent
    before any worker started) waits for the group within its timeout, then for the job;
    with no worker at all it ends in a TimeoutError that says what is missing."""
    async with sw.AsyncProducer.from_url(redis_url) as producer:
        await producer.send(S, {}, key="before-any-worker")
        with pytest.raises(TimeoutError, match="no consumer group") as late:
            await producer.result(S, "before-any-worker", timeout=0.2)
        assert "start one, or pass group=" in str(late.value)
        with pytest.raises(TimeoutError, match="no consumer group"):
            await producer.result("never-sent-to", "k", timeout=0.2)
        def groups_asked() -> int:
            stats = r.info("commandstats")
            return int(stats.get("cmdstat_xinfo|groups", {}).get("calls", 0))

        asked = groups_asked()
        waiting = asyncio.create_task(producer.result(S, "before-any-worker", timeout=60))
        # it asks for the groups again and again while there is none
        await await_for(lambda: groups_asked() >= asked + 3, 30)
        assert not waiting.done()
        worker = RecordsWorker.from_url(redis_url)
        async with serving(worker):
            value = await waiting
        assert value["key"] == "before-any-worker" and value["group"] == "billing"


# ---- 4. max_result_bytes ---------------------------------------------------------------

async def test_result_over_max_result_bytes_completes_without_keeping_it(
    redis_url: str, r: redis.Redis
) -> None:
    """Under the cap the result is kept; over it the job still completes (acked once, no
    retry, no dead letter), status.result is None and result_note says why."""
    producer = sw.Producer.from_url(redis_url)
    producer.send_many(S, [{"big": 100}, {"big": 5000}], keys=["small", "large"])
    worker = RecordsWorker.from_url(redis_url, max_result_bytes=1024)
    await run_until_idle(worker, r)
    small = producer.status(S, "small", group="billing")
    assert small.state == "done" and small.result["blob"] == "x" * 100
    assert small.result_note == ""
    large = producer.status(S, "large", group="billing")
    assert large.state == "done" and large.result is None
    assert "not kept" in large.result_note and "max_result_bytes=1024" in large.result_note
    assert producer.result(S, "large", group="billing", timeout=1) is None
    assert worker.counts["acked"] == 2 and worker.counts["retried"] == 0
    assert ledger(r, "billing") == {"small": 1, "large": 1}
    assert r.xlen(KEYS.dead) == 0
    producer.close()


# ---- 5. local cache --------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["built-in", "cachetools", "off"])
async def test_local_cache_acks_a_duplicate_completed_here_without_running(
    redis_url: str, r: redis.Redis, kind: str
) -> None:
    """A key completed in this process, sent again: with the built-in cache (the default)
    or a cachetools.TTLCache it is acked as deduplicated without running, even though its
    job record is deleted first (so only the local cache can know). With local_cache=False
    the same duplicate runs again: the deletion is what makes the check bite."""
    cache = cachetools.TTLCache(maxsize=1000, ttl=60)
    options: dict[str, Any] = {"built-in": {}, "cachetools": {"local_cache": cache},
                               "off": {"local_cache": False}}[kind]
    producer = sw.Producer.from_url(redis_url)
    producer.send(S, {}, key="a")
    worker = RecordsWorker.from_url(redis_url, **options)
    async with serving(worker):
        await until_idle(r)
        await await_for(lambda: worker.counts["acked"] == 1, 10, message="the first ack")
        assert r.delete(KEYS.group("billing").job("a")) == 1
        producer.send(S, {}, key="a")
        await until_idle(r)
        if kind == "off":
            await await_for(lambda: worker.counts["acked"] == 2, 10, message="the rerun")
        else:
            await await_for(lambda: worker.counts["deduplicated"] == 1, 10,
                            message="the duplicate to be counted")
    if kind == "off":
        assert runs(r, "billing", "a") == [1, 1]
        assert worker.counts["deduplicated"] == 0
    else:
        assert runs(r, "billing", "a") == [1]
        assert worker.counts["consumed"] == 1 and worker.counts["acked"] == 1
    if kind == "cachetools":
        assert "a" in cache, "the user's cache must be the one used"
    producer.close()


@pytest.mark.parametrize("dedup", [True, False], ids=["dedup-on", "dedup-off"])
@pytest.mark.parametrize("bad", [42, set()], ids=["int", "set"])
def test_bad_local_cache_is_a_config_error(bad: object, dedup: bool) -> None:
    """local_cache takes None, False or a mutable mapping; anything else is refused when
    the worker is built (whatever the other options), naming local_cache."""
    url = "redis://127.0.0.1:1/0"  # never contacted: options are checked first
    for build in (RecordsWorker.from_url, RecordsWorker):
        with pytest.raises(sw.ConfigError, match="local_cache") as info:
            build(url, local_cache=bad, dedup=dedup)
        assert info.value.option == "local_cache"


# ---- 6. streamwork job -----------------------------------------------------------------

async def test_job_command_prints_the_status(redis_url: str, r: redis.Redis) -> None:
    """`streamwork job`: --json parses and gives state and result; plain output shows the
    state; with two groups on the stream and no --group it exits non-zero and says to pass
    the group; with --group it answers for that group."""
    producer = sw.Producer.from_url(redis_url)
    producer.send(S, {}, key="job-1")
    await run_until_idle(RecordsWorker.from_url(redis_url), r)
    producer.close()

    out = cli("job", S, "job-1", "--json", "--url", redis_url)
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["state"] == "done" and data["group"] == "billing" and data["key"] == "job-1"
    assert data["result"] == {"key": "job-1", "group": "billing", "attempt": 1,
                              "pid": os.getpid()}

    out = cli("job", S, "job-1", "--url", redis_url)
    assert out.exit_code == 0, out.output
    assert re.search(r"^\s*state: done$", out.output, re.M), out.output
    assert "'pid'" in out.output

    out = cli("job", S, "never-sent", "--url", redis_url)
    assert out.exit_code == 0 and re.search(r"state: unknown", out.output), out.output

    r.xgroup_create(S, "mailer", id="0")
    out = cli("job", S, "job-1", "--url", redis_url)
    assert out.exit_code != 0
    assert isinstance(out.exception, SystemExit), out.exception  # a message, no traceback
    assert "billing" in out.output and "mailer" in out.output, out.output
    assert "group" in out.output.split(":", 1)[1], out.output  # past click's "Error:"

    out = cli("job", S, "job-1", "--group", "mailer", "--json", "--url", redis_url)
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["state"] == "unknown"
    out = cli("job", S, "job-1", "--group", "billing", "--json", "--url", redis_url)
    assert out.exit_code == 0 and json.loads(out.output)["state"] == "done", out.output


async def test_job_command_asks_for_the_cli_option_when_groups_are_ambiguous(
    redis_url: str, r: redis.Redis
) -> None:
    """On the command line the way to name the group is `--group G`: the error for a
    stream with two groups must say that, not the Python keyword `group=...`."""
    for group in GROUPS:
        r.xgroup_create(S, group, id="0", mkstream=True)
    out = cli("job", S, "job-1", "--url", redis_url)
    assert out.exit_code != 0
    assert "--group" in out.output, f"the message must say to pass --group: {out.output}"


def test_job_command_on_a_missing_stream(redis_url: str, r: redis.Redis) -> None:
    """With --group, a stream nobody created is just an unknown job. Without --group the
    group cannot be found: the command must fail with a message naming the stream (as
    every other streamwork command does), not with a raw redis error and traceback."""
    out = cli("job", "nosuch", "k", "--group", "billing", "--json", "--url", redis_url)
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["state"] == "unknown"
    out = cli("job", "nosuch", "k", "--url", redis_url)
    assert out.exit_code != 0
    assert isinstance(out.exception, SystemExit), (
        f"a raw {type(out.exception).__name__} ({out.exception}) escaped the command")
    assert "nosuch" in out.output, out.output
    assert "does not exist" in out.output, out.output
    r.set("notastream", "x")
    out = cli("job", "notastream", "k", "--url", redis_url)
    assert out.exit_code != 0 and isinstance(out.exception, SystemExit), out.output
    assert "is not a stream" in out.output, out.output


# ---- 7. a waiting record does not block a later copy --------------------------------------

async def test_a_waiting_job_does_not_block_a_later_copy_and_its_retry_is_then_a_duplicate(
    redis_url: str, r: redis.Redis
) -> None:
    """Copy 1 of a key fails and waits for a retry (record: waiting). Copy 2 of the same key,
    sent meanwhile, runs at once and completes (record: done, its result). When copy 1's
    retry comes due, it is acknowledged as a duplicate without running: one effect."""
    worker = RecordsWorker.from_url(redis_url, retry_delay=600.0, retry_max_delay=600.0,
                                    dedup_window=3600.0)
    g = KEYS.group("billing")
    with sw.Producer.from_url(redis_url) as producer:
        async with serving(worker):
            producer.send(S, {"fail_once_in": "billing"}, key="k")
            await await_for(lambda: worker.counts["retried"] == 1, message="copy 1 failed")
            waiting = producer.status(S, "k", group="billing")
            assert waiting.state == "waiting" and "card declined" in waiting.error
            producer.send(S, {}, key="k")
            await await_for(lambda: producer.status(S, "k", group="billing").state == "done",
                            message="copy 2 done while copy 1 waits")
            first = producer.status(S, "k", group="billing")
            assert first.result["attempt"] == 1 and runs(r, "billing", "k") == [1, 1]
            [member] = r.zrange(g.retries, 0, -1)
            r.zadd(g.retries, {member: 0})  # copy 1's retry is due now
            await await_for(lambda: worker.counts["deduplicated"] == 1,
                            message="copy 1's retry acked as a duplicate")
            await until_idle(r)
        assert runs(r, "billing", "k") == [1, 1], "the retry did not run the handler"
        assert ledger(r, "billing") == {"k": 1}
        assert producer.status(S, "k", group="billing") == first
