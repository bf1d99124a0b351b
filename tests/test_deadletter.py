"""Dead letters and their CLI: ``streamwork dlq list|replay|purge`` show, bring back and
delete exactly what they say."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from streamwork import Producer
from streamwork._cli.main import main
from streamwork._ops.deadletter import list_dead, replay_dead
from streamwork._wire.keys import StreamKeys
from streamwork.testing import Ledger, await_for, run_until_idle, wait_for
from tests.workers.recording import RecordingWorker, calls

STREAM, GROUP = "jobs", "testers"
KEYS = StreamKeys.for_stream(STREAM)
FIX = "fixed"  # the dead-lettered jobs succeed once this Redis key exists


def _cli(url: str, *args: str, input: str | None = None) -> Result:
    runner = CliRunner(env={"COLUMNS": "250"})
    return runner.invoke(main, ["dlq", *args, "--url", url], input=input)


async def _make_dead(r: redis.Redis, url: str, n: int) -> dict[str, bytes]:
    """Dead-letter ``n`` jobs through a real worker; returns key -> original body."""
    keys = [f"dl-{i}" for i in range(n)]
    with Producer.from_url(url) as p:
        ids = p.send_many(STREAM, [{"dead_unless": FIX, "i": i} for i in range(n)], keys=keys)
    bodies = {k: r.xrange(STREAM, i, i)[0][1][b"d"] for k, i in zip(keys, ids, strict=True)}
    await run_until_idle(RecordingWorker.from_url(url), r, timeout=60)
    assert r.xlen(KEYS.dead) == n
    return bodies


def _dead_keys(r: redis.Redis) -> list[str | None]:
    return [e.key for e in list_dead(r, STREAM)]


async def test_dlq_list_table_and_json(r: redis.Redis, redis_url: str) -> None:
    """`dlq list` shows each dead letter (key, reason, error) as a table and as JSON lines."""
    await _make_dead(r, redis_url, 3)
    dead_ids = [eid.decode() for eid, _ in r.xrange(KEYS.dead)]

    table = _cli(redis_url, "list", STREAM)
    assert table.exit_code == 0, table.output
    for i, eid in enumerate(dead_ids):
        assert eid in table.output
        assert f"dl-{i}" in table.output
    assert table.output.count(f"dead_letter: {FIX} is not set") == 3
    assert "DeadLetter" in table.output

    js = _cli(redis_url, "list", STREAM, "--json")
    assert js.exit_code == 0, js.output
    rows = [json.loads(line) for line in js.output.splitlines()]
    assert [row["id"] for row in rows] == dead_ids
    assert [row["key"] for row in rows] == ["dl-0", "dl-1", "dl-2"]
    assert [row["payload"] for row in rows] == [{"dead_unless": FIX, "i": i} for i in range(3)]
    for row in rows:
        assert row["reason"] == f"dead_letter: {FIX} is not set"
        assert row["error_type"] == "DeadLetter"
        assert row["attempts"] == 1
        assert row["group"] == GROUP, "a dead letter names the group it died in"
        assert r.xrange(STREAM, row["src_id"], row["src_id"]), "src_id names the original entry"

    r.xadd("other", {"x": "1"})  # a stream without dead letters
    empty = _cli(redis_url, "list", "other")
    assert empty.exit_code == 0
    assert "0 shown" in empty.output
    missing = _cli(redis_url, "list", "no-such-stream")  # not "0 shown": a wrong name
    assert missing.exit_code == 1 and "does not exist" in missing.output, missing.output


async def test_dlq_replay_by_id_and_all(r: redis.Redis, redis_url: str) -> None:
    """`dlq replay --id X` / `--all` re-enqueue just those (fresh attempts); they get handled."""
    bodies = await _make_dead(r, redis_url, 3)
    r.set(FIX, 1)
    first = list_dead(r, STREAM)[1]
    assert first.key == "dl-1"
    before = r.xlen(STREAM)
    retry = KEYS.group(GROUP).retry

    res = _cli(redis_url, "replay", STREAM, "--id", first.id)
    assert res.exit_code == 0, res.output
    assert "replayed 1, skipped 0" in res.output
    assert _dead_keys(r) == ["dl-0", "dl-2"]
    [(_, fields)] = r.xrevrange(retry, count=1)
    assert fields == {b"d": bodies["dl-1"]}, "replayed entry carries the original body only"
    assert r.xlen(STREAM) == before, "a replay goes to the group's retry stream only"
    await run_until_idle(RecordingWorker.from_url(redis_url), r, timeout=60)
    assert Ledger(r).counts() == {"dl-1": 1}
    assert [a for a, _ in calls(r, "dl-1")] == [1, 1], "a replay starts a fresh attempt series"

    res = _cli(redis_url, "replay", STREAM, "--id", "1-1")
    assert res.exit_code == 0, res.output
    assert "replayed 0, skipped 1" in res.output

    res = _cli(redis_url, "replay", STREAM, "--all")
    assert res.exit_code == 0, res.output
    assert "replayed 2, skipped 0" in res.output
    assert r.xlen(KEYS.dead) == 0
    await run_until_idle(RecordingWorker.from_url(redis_url), r, timeout=60)
    assert Ledger(r).counts() == {"dl-0": 1, "dl-1": 1, "dl-2": 1}

    res = _cli(redis_url, "replay", STREAM)
    assert res.exit_code != 0, "replay without --id or --all must refuse"


async def test_dlq_replay_keeps_dead_letters_it_could_not_enqueue(
    r: redis.Redis, redis_url: str
) -> None:
    """A replay whose re-enqueue fails leaves every dead letter in place."""
    await _make_dead(r, redis_url, 2)
    before = r.xrange(KEYS.dead)
    retry = KEYS.group(GROUP).retry
    r.delete(retry)
    r.set(retry, "not a stream")  # every XADD to the group's retry stream now fails
    res = _cli(redis_url, "replay", STREAM, "--all")
    assert res.exit_code != 0
    assert "stay in the dead-letter stream" in res.output
    assert r.xrange(KEYS.dead) == before


async def test_dlq_purge_removes_only_what_it_says(r: redis.Redis, redis_url: str) -> None:
    """`dlq purge` deletes only --older-than / --id matches, and nothing if the prompt says no."""
    await _make_dead(r, redis_url, 4)
    # re-file the first two dead letters as one hour old
    letters = r.xrange(KEYS.dead)
    r.delete(KEYS.dead)
    old_ms = int((time.time() - 3600) * 1000)
    for seq, (_, fields) in enumerate(letters[:2]):
        r.xadd(KEYS.dead, fields, id=f"{old_ms}-{seq}")
    for _, fields in letters[2:]:
        r.xadd(KEYS.dead, fields)
    assert _dead_keys(r) == ["dl-0", "dl-1", "dl-2", "dl-3"]

    res = _cli(redis_url, "purge", STREAM, "--older-than", "600", input="n\n")
    assert res.exit_code != 0
    assert "Delete dead letters older than 600s of jobs?" in res.output
    assert _dead_keys(r) == ["dl-0", "dl-1", "dl-2", "dl-3"]

    res = _cli(redis_url, "purge", STREAM, "--older-than", "600", "--yes")
    assert res.exit_code == 0, res.output
    assert "deleted 2" in res.output
    assert _dead_keys(r) == ["dl-2", "dl-3"]

    target = list_dead(r, STREAM)[1]
    res = _cli(redis_url, "purge", STREAM, "--id", target.id, "--yes")
    assert res.exit_code == 0, res.output
    assert "deleted 1" in res.output
    assert _dead_keys(r) == ["dl-2"]

    res = _cli(redis_url, "purge", STREAM, input="n\n")
    assert res.exit_code != 0
    assert _dead_keys(r) == ["dl-2"]
    res = _cli(redis_url, "purge", STREAM, input="y\n")
    assert res.exit_code == 0, res.output
    assert r.xlen(KEYS.dead) == 0
    assert r.xlen(STREAM) == 4, "purge never touches the stream itself"


@pytest.mark.parametrize("args", [("--older-than", "600"), ("--id", "1-0")])
def test_dlq_purge_on_empty_dead_stream(redis_url: str, r: redis.Redis,
                                        args: tuple[str, ...]) -> None:
    """Purging a stream without dead letters deletes nothing and succeeds."""
    r.xadd(STREAM, {"x": "1"})
    res = _cli(redis_url, "purge", STREAM, *args, "--yes")
    assert res.exit_code == 0, res.output
    assert "deleted 0" in res.output


class _PacedClient(redis.Redis):
    """A client whose every read of the dead-letter stream after the first waits until the
    worker has dead-lettered again every job replayed so far: a replay slower than the
    worker, made deterministic. Gives up after ``max_pages`` reads, so a replay that keeps
    following its own re-dead-lettered jobs fails fast instead of running forever."""

    expect_dead = 0
    max_pages = 10
    pages = 0

    def xrange(self, name: Any, min: Any = "-", max: Any = "+",
               count: Any = None) -> Any:
        if name == KEYS.dead:
            self.pages += 1
            if self.pages > self.max_pages:
                raise AssertionError(f"replay read {self.pages} pages: it is replaying "
                                     "dead letters added after it started")
            if self.pages > 1:
                wait_for(lambda: self.xlen(KEYS.dead) == self.expect_dead, 10,
                         message="the replayed jobs to be dead-lettered again")
        return super().xrange(name, min, max, count)


async def test_replay_all_replays_only_what_was_dead_when_it_started(
    r: redis.Redis, redis_url: str
) -> None:
    """`replay --all` while a worker dead-letters the replayed jobs again: each of the 300
    dead letters is replayed once, the call returns, the handler runs each key once more."""
    n = 300
    await _make_dead(r, redis_url, n)  # FIX is never set: every replay dies again
    keys = [f"dl-{i}" for i in range(n)]
    assert all(len(calls(r, k)) == 1 for k in keys)

    paced = _PacedClient.from_url(redis_url)
    paced.expect_dead = n
    worker = RecordingWorker.from_url(redis_url)
    task = asyncio.create_task(worker.serve())
    try:
        replayed, skipped = await asyncio.wait_for(
            asyncio.to_thread(replay_dead, paced, STREAM, None, 100), timeout=25)
        assert (replayed, skipped) == (n, 0)
        assert paced.pages == 3, "three pages of 100, nothing past the last dead id"
        await await_for(lambda: r.xlen(KEYS.dead) == n
                        and all(len(calls(r, k)) == 2 for k in keys), 20,
                        message="every replayed job to be dead-lettered again")
    finally:
        worker.stop()
        await task
        paced.close()
    assert {k: [a for a, _ in calls(r, k)] for k in keys} == {k: [1, 1] for k in keys}, \
        "the handler ran each key exactly once more"
    assert r.xlen(KEYS.dead) == n
