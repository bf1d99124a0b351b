"""`inspect`, `top`, `job` and `dlq` on a partitioned stream (``--partitions P``, ``--partition
N``), against a real server: jobs sent with ``Producer.from_url(url, partitions=4)`` and run
by a real worker over the 4 partitions, some of them dead-lettered."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

import streamwork as sw
from streamwork._cli.main import main
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names, partition_of
from streamwork.testing import await_for, run_until_idle
from tests.helpers.cluster_util import local_cluster
from tests.test_cli_ops import row, rows

STREAM, GROUP, P = "orders", "billing", 4
NAMES = partition_names(STREAM, P)
KEYS = [f"job-{i}" for i in range(24)]
BAD = KEYS[::3]  #: dead-lettered on the first run (8 of them)
FIXED = {"on": False}  #: the handler lets BAD jobs through once the test sets this


class SplitWorker(sw.StreamWorker):
    """4 partitions; a job whose payload says ``bad`` is dead-lettered until FIXED."""

    stream = STREAM
    group = GROUP
    partitions = P
    concurrency = 8
    visibility_timeout = 2.0
    retry_delay = 0.05
    read_block = 0.1
    drain_timeout = 5.0

    async def handle(self, msg: sw.Message) -> int:
        if msg.payload.get("bad") and not FIXED["on"]:
            raise sw.DeadLetter("bad")
        return int(msg.payload["i"])


class OrderedSplitWorker(SplitWorker):
    ordered = True


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env={"COLUMNS": "250", **(env or {})}).invoke(main, list(args))


def dead_key(i: int) -> str:
    return StreamKeys.for_stream(NAMES[i]).dead


async def run_first(redis_url: str, r: redis.Redis) -> None:
    """Send KEYS over the 4 partitions, run the worker until idle: BAD ones are dead."""
    FIXED["on"] = False
    with sw.Producer.from_url(redis_url, partitions=P) as producer:
        producer.send_many(STREAM, [{"i": i, "bad": k in BAD} for i, k in enumerate(KEYS)],
                           keys=KEYS)
    assert {partition_of(k, P) for k in BAD} == set(range(P)), "dead letters in every partition"
    await run_until_idle(SplitWorker.from_url(redis_url), r, timeout=30)
    assert sum(r.xlen(dead_key(i)) for i in range(P)) == len(BAD)


async def test_inspect_and_top_add_up_the_partitions(redis_url: str, r: redis.Redis) -> None:
    """`inspect --partitions 4`: totals are the sums of the per-partition figures (which are
    what Redis says of each partition); `--partition N` shows that one alone; `top` too."""
    await run_first(redis_url, r)
    with sw.Producer.from_url(redis_url, partitions=P) as producer:  # unread: lag
        producer.send_many(STREAM, [{"i": 100 + i} for i in range(6)],
                           keys=[f"late-{i}" for i in range(6)])
        producer.send(STREAM, {"i": 200}, key="later", delay=600)
    r.xreadgroup(GROUP, "peeker", {NAMES[1]: ">"}, count=1)  # one pending in partition 1

    out = cli("inspect", STREAM, "--partitions", "4", "--json", "--url", redis_url)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    parts = doc["partitions"]
    assert (doc["stream"], doc["partition_count"]) == (STREAM, P)
    assert [(p["index"], p["stream"]) for p in parts] == list(enumerate(NAMES))
    for p in parts:  # each partition's own figures are Redis's
        info = r.xinfo_groups(p["stream"])[0]
        g = p["stats"]["groups"][0]
        assert p["stats"]["length"] == r.xlen(p["stream"])
        assert p["stats"]["dead"] == r.xlen(dead_key(p["index"]))
        assert (g["lag"], g["pending"]) == (info["lag"], info["pending"])
        assert p["owners"] == {GROUP: None}  # not ordered: no partition lease
    stats = [p["stats"] for p in parts]
    billing = doc["groups"][0]
    assert doc["length"] == sum(s["length"] for s in stats) == len(KEYS) + 6
    assert doc["dead"] == sum(s["dead"] for s in stats) == len(BAD)
    assert doc["delayed_total"] == sum(s["delayed_total"] for s in stats) == 1
    assert billing["lag"] == sum(s["groups"][0]["lag"] for s in stats) == 5
    assert billing["pending"] == sum(s["groups"][0]["pending"] for s in stats) == 1
    assert billing["entries_read"] == sum(s["groups"][0]["entries_read"] for s in stats)
    assert billing["top_consumers"] == [{"name": "peeker", "pending": 1}]

    human = cli("inspect", STREAM, "--partitions", "4", "--url", redis_url)
    assert human.exit_code == 0, human.output
    assert "stream orders (totals of 4 partitions)" in human.stdout
    assert row(human.stdout, str(len(KEYS) + 6))[5] == str(len(BAD))  # totals: length, dead
    per = {cells[1]: cells for cells in rows(human.stdout) if cells[1] in NAMES}
    assert sorted(per) == sorted(NAMES)
    assert per[NAMES[1]][2] == str(r.xlen(NAMES[1])) and per[NAMES[1]][5] == GROUP

    one = cli("inspect", STREAM, "--partitions", "4", "--partition", "2", "--json",
              "--url", redis_url)
    assert one.exit_code == 0, one.output
    doc2 = json.loads(one.stdout)
    assert doc2["stream"] == NAMES[2] and [p["index"] for p in doc2["partitions"]] == [2]
    assert (doc2["length"], doc2["dead"]) == (r.xlen(NAMES[2]), r.xlen(dead_key(2)))
    text = cli("inspect", STREAM, "--partitions", "4", "--partition", "2", "--url", redis_url)
    assert f"stream {NAMES[2]} (partition 2 of 4)" in text.stdout
    assert not [n for n in NAMES if n != NAMES[2] and n in text.stdout]

    alerts = cli("inspect", STREAM, "--partitions", "4", "-q", "--fail-if", "dead>0",
                 "--fail-if", "lag>4", "--url", redis_url)
    assert alerts.exit_code == 2
    assert alerts.stderr.splitlines() == [f"FAIL orders: dead {len(BAD)} > 0",
                                          "FAIL orders/billing: lag 5 > 4"]

    # no STREAM: the partitions count as one stream "orders", other streams as they are
    r.xadd("emails", {"d": b"x"})
    every = json.loads(cli("inspect", "--partitions", "4", "--json", "--url", redis_url).stdout)
    assert [(s["stream"], s["length"]) for s in every] == [("emails", 1), (STREAM, 30)]
    plain = json.loads(cli("inspect", "--json", "--url", redis_url).stdout)
    assert sorted(s["stream"] for s in plain) == sorted(["emails", *NAMES])  # unchanged

    # a wrong partition count: refused, with the recorded one to give instead
    for args in (["inspect", STREAM], ["top", STREAM, "--once"], ["job", STREAM, "job-1"],
                 ["dlq", "list", STREAM], ["dlq", "replay", STREAM, "--all"],
                 ["dlq", "purge", STREAM, "--yes"]):
        refused = cli(*args, "--partitions", "3", "--url", redis_url)
        assert refused.exit_code == 1, (args, refused.output)
        assert "is split into 4 partitions" in refused.output, refused.output
        assert "give --partitions 4" in refused.output, refused.output
    assert sum(r.xlen(dead_key(i)) for i in range(P)) == len(BAD)
    # ... and when no count is recorded, the partitions not found are named on stderr
    r.delete(StreamKeys.for_stream(STREAM).partitions)
    none = cli("inspect", STREAM, "--partitions", "3", "-q", "--url", redis_url)
    assert none.exit_code == 1 and "no stream for any of its 3 partitions" in none.output
    r.xadd(partition_names(STREAM, 3)[0], {"d": b"x"})  # one of the 3 exists, 2 do not
    wrong = cli("inspect", STREAM, "--partitions", "3", "-q", "--url", redis_url)
    missing = [i for i, n in enumerate(partition_names(STREAM, 3)) if not r.exists(n)]
    assert wrong.exit_code == 0 and missing, wrong.output
    assert wrong.stderr.startswith(f"WARN orders: no stream for partition {missing[0]} ")
    assert "check --partitions" in wrong.stderr

    top = cli("top", STREAM, "--partitions", "4", "--once", "--interval", "0.1",
              "--url", redis_url)
    assert top.exit_code == 0, top.output
    assert row(top.stdout, STREAM)[1] == str(len(KEYS) + 6)
    for i, name in enumerate(NAMES):
        assert row(top.stdout, f"{STREAM}#{i}")[2] == str(r.xlen(name))


async def test_job_finds_the_record_in_its_partition(redis_url: str, r: redis.Redis) -> None:
    """`job STREAM KEY --partitions 4` answers from the partition holding the record and
    says which; `--partition N` looks in N only."""
    await run_first(redis_url, r)
    good = next(k for k in KEYS if k not in BAD and partition_of(k, P) != 0)
    home = partition_of(good, P)
    out = cli("job", STREAM, good, "--partitions", "4", "--json", "--url", redis_url)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert (doc["state"], doc["result"], doc["group"]) == ("done", KEYS.index(good), GROUP)
    assert (doc["partition"], doc["partition_stream"]) == (home, NAMES[home])
    text = cli("job", STREAM, good, "--partitions", "4", "--url", redis_url)
    assert f"partition: {home}" in text.output and "state: done" in text.output

    bad = next(k for k in BAD if partition_of(k, P) != 0)
    dead = json.loads(cli("job", STREAM, bad, "--partitions", "4", "--json",
                          "--url", redis_url).output)
    assert (dead["state"], dead["reason"], dead["partition"]) == (
        "dead", "dead_letter: bad", partition_of(bad, P))
    assert r.xrange(dead_key(partition_of(bad, P)), dead["dead_letter_id"],
                    dead["dead_letter_id"])

    there = cli("job", STREAM, good, "--partitions", "4", "--partition", str(home), "--json",
                "--url", redis_url)
    assert json.loads(there.output)["state"] == "done", there.output
    other = (home + 1) % P
    elsewhere = cli("job", STREAM, good, "--partitions", "4", "--partition", str(other),
                    "--json", "--url", redis_url)
    assert json.loads(elsewhere.output)["state"] == "unknown", elsewhere.output
    never = cli("job", STREAM, "never-sent", "--partitions", "4", "--url", redis_url)
    assert "state: unknown" in never.output and "partition: none has a record" in never.output
    # without --partitions the count recorded in {S}:partitions is used: found all the same
    auto = cli("job", STREAM, good, "--json", "--url", redis_url)
    assert auto.exit_code == 0, auto.output
    assert (json.loads(auto.output)["state"], json.loads(auto.output)["partition"]) == (
        "done", home)
    # an explicit --partitions 1 looks at the plain stream "orders", which does not exist
    plain = cli("job", STREAM, good, "--partitions", "1", "--url", redis_url)
    assert plain.exit_code == 1 and "does not exist" in plain.output


async def test_dlq_lists_and_replays_every_partition(redis_url: str, r: redis.Redis) -> None:
    """`dlq list --partitions 4` lists every dead letter with its partition; `dlq replay`
    puts each back into its own partition's retry stream; a second run then does them."""
    await run_first(redis_url, r)
    out = cli("dlq", "list", STREAM, "--partitions", "4", "--json", "--url", redis_url)
    assert out.exit_code == 0, out.output
    listed = [json.loads(line) for line in out.output.splitlines()]
    assert sorted(d["key"] for d in listed) == sorted(BAD)
    for d in listed:
        assert d["partition"] == partition_of(d["key"], P) and d["stream"] == NAMES[d["partition"]]
        assert d["reason"] == "dead_letter: bad" and d["group"] == GROUP
    assert [d["id"] for d in listed] == sorted((d["id"] for d in listed),
                                               key=lambda i: tuple(map(int, i.split("-"))))
    table = cli("dlq", "list", STREAM, "--partitions", "4", "--url", redis_url)
    assert f"({len(BAD)} shown)" in table.output
    for d in listed:
        assert any(cells[:2] == [str(d["partition"]), d["id"]] for cells in rows(table.output))
    only = cli("dlq", "list", STREAM, "--partitions", "4", "--partition", "3", "--json",
               "--url", redis_url)
    assert sorted(json.loads(line)["key"] for line in only.output.splitlines()) == sorted(
        k for k in BAD if partition_of(k, P) == 3)
    # without --partitions: the recorded count; with --partitions 1: the plain stream
    assert "all 4 partitions (8 shown)" in cli("dlq", "list", STREAM, "--url", redis_url).output
    assert "0 shown" in cli("dlq", "list", STREAM, "--partitions", "1", "--url",
                            redis_url).output

    # by id: the partition holding it is found; an id two partitions share (dead letters
    # written in the same millisecond) needs --partition
    shared = Counter(d["id"] for d in listed)
    by_id = [d for d in listed if shared[d["id"]] == 1][:1]
    by_id += [d for d in listed if shared[d["id"]] > 1][:1]
    for d in by_id:
        where = ["--partition", str(d["partition"])] if shared[d["id"]] > 1 else []
        one = cli("dlq", "replay", STREAM, "--partitions", "4", "--id", d["id"], *where,
                  "--url", redis_url)
        assert one.exit_code == 0, one.output
        assert one.output.splitlines()[-1].startswith("replayed 1, skipped 0"), one.output
        assert not r.xrange(dead_key(d["partition"]), d["id"], d["id"])
    rest = cli("dlq", "replay", STREAM, "--partitions", "4", "--all", "--url", redis_url)
    assert rest.exit_code == 0, rest.output
    assert rest.output.splitlines()[-1].startswith(
        f"replayed {len(BAD) - len(by_id)}, skipped 0"), rest.output
    for i in range(P):
        mine = [k for k in BAD if partition_of(k, P) == i]
        assert r.xlen(dead_key(i)) == 0
        assert r.xlen(StreamKeys.for_stream(NAMES[i]).group(GROUP).retry) == len(mine)
        assert f"partition {i} ({NAMES[i]}): replayed" in rest.output

    FIXED["on"] = True
    try:
        await run_until_idle(SplitWorker.from_url(redis_url), r, timeout=30)
    finally:
        FIXED["on"] = False
    with sw.Producer.from_url(redis_url, partitions=P) as producer:
        for k in BAD:
            st = producer.status(STREAM, k, group=GROUP)
            assert (st.state, st.result) == ("done", KEYS.index(k)), st
    assert sum(r.xlen(dead_key(i)) for i in range(P)) == 0


def test_dlq_purge_and_ambiguous_ids(redis_url: str, r: redis.Redis) -> None:
    """An id held by two partitions' dead letters needs --partition (nothing changes
    before); purge works per partition."""
    for i in (0, 2):
        r.xadd(dead_key(i), {"reason": "x", "group": GROUP, "f.d": b"?"}, id="1-1")
    r.xadd(dead_key(3), {"reason": "x", "group": GROUP, "f.d": b"?"}, id="1-2")
    out = cli("dlq", "replay", STREAM, "--partitions", "4", "--id", "1-1", "--url", redis_url)
    assert out.exit_code == 1 and "in 2 partitions" in out.output and "--partition" in out.output
    assert [r.xlen(dead_key(i)) for i in range(P)] == [1, 0, 1, 1]
    gone = cli("dlq", "purge", STREAM, "--partitions", "4", "--partition", "2", "--yes",
               "--url", redis_url)
    assert gone.output.strip() == "deleted 1"
    assert [r.xlen(dead_key(i)) for i in range(P)] == [1, 0, 0, 1]
    by_id = cli("dlq", "purge", STREAM, "--partitions", "4", "--id", "1-2", "--yes",
                "--url", redis_url)
    assert by_id.output.strip() == "deleted 1"
    rest = cli("dlq", "purge", STREAM, "--partitions", "4", "--yes", "--url", redis_url)
    assert rest.output.strip() == "deleted 1"
    assert [r.xlen(dead_key(i)) for i in range(P)] == [0, 0, 0, 0]


BAD_INPUT: list[tuple[list[str], str]] = [
    (["inspect", STREAM, "--partition", "9", "--partitions", "6"], "numbered 0 to 5"),
    (["inspect", STREAM, "--partitions", "0"], "not a partition count"),
    (["inspect", STREAM, "--partition", "1"], "give --partitions P"),
    (["inspect", STREAM, "--partition", "-1", "--partitions", "4"], "numbered from 0"),
    (["inspect", "--partitions", "4", "--partition", "1"], "needs a STREAM"),
    (["inspect", "{orders}:eu", "--partitions", "4"], "hash tag"),
    (["top", STREAM, "--once", "--partitions", "4", "--partition", "4"], "numbered 0 to 3"),
    (["job", STREAM, "k", "--partitions", "2000"], "not a partition count"),
    (["job", STREAM, "k", "--partition", "3", "--partitions", "2"], "numbered 0 to 1"),
    (["dlq", "list", STREAM, "--partition", "9", "--partitions", "6"], "numbered 0 to 5"),
    (["dlq", "replay", STREAM, "--all", "--partition", "9", "--partitions", "6"],
     "numbered 0 to 5"),
    (["dlq", "purge", STREAM, "--yes", "--partitions", "0"], "not a partition count"),
]


def test_bad_partition_options_are_usage_errors_and_change_nothing(
        redis_url: str, r: redis.Redis) -> None:
    for i in range(P):
        r.xadd(dead_key(i), {"reason": "x", "group": GROUP, "f.d": b"?"})
    before = sorted(r.keys())
    for args, says in BAD_INPUT:
        out = cli(*args, "--url", redis_url)
        assert out.exit_code == 2, (args, out.output)
        assert says in out.output and "Traceback" not in out.output, (args, out.output)
    assert sorted(r.keys()) == before and [r.xlen(dead_key(i)) for i in range(P)] == [1] * P
    env = cli("dlq", "list", STREAM, "--json", "--url", redis_url,
              env={"STREAMWORK_PARTITIONS": "4"})  # the option from the environment
    assert sorted(json.loads(line)["partition"] for line in env.output.splitlines()) == [0, 1,
                                                                                        2, 3]


async def test_inspect_shows_the_owner_of_each_partition_in_ordered_mode(
        redis_url: str, r: redis.Redis) -> None:
    """While an ordered worker runs, each partition's row names the member holding its
    lease (GET of the group's owner key)."""
    with sw.Producer.from_url(redis_url, partitions=P) as producer:
        producer.send_many(STREAM, [{"i": i} for i in range(8)],
                           keys=[f"o-{i}" for i in range(8)])
    worker = OrderedSplitWorker.from_url(redis_url)
    task = asyncio.create_task(worker.serve())
    owners = [StreamKeys.for_stream(n).group(GROUP).owner for n in NAMES]

    def ready() -> bool:  # leases taken, and the consumers have created the group there
        return all(r.get(k) for k in owners) and all(
            r.exists(n) and any(g["name"] == GROUP.encode() for g in r.xinfo_groups(n))
            for n in NAMES)

    try:
        await await_for(ready, timeout=15,
                        message="the ordered worker holds every partition and reads it")
        out: Any = await asyncio.to_thread(cli, "inspect", STREAM, "--partitions", "4",
                                           "--json", "--url", redis_url)
        human: Any = await asyncio.to_thread(cli, "inspect", STREAM, "--partitions", "4",
                                             "--url", redis_url)
    finally:
        worker.stop()
        await task
    member = r.get(owners[0])  # released on stop
    assert member is None
    doc = json.loads(out.stdout)
    held = {p["owners"][GROUP] for p in doc["partitions"]}
    assert len(held) == 1 and None not in held, doc["partitions"]
    (who,) = held
    assert all(row(human.stdout, str(i))[-1] == who for i in range(P)), human.stdout


@pytest.mark.cluster
def test_inspect_names_the_cluster_node_of_each_partition(make_server: Any) -> None:
    """On a Cluster URL each partition's row says which master serves its slot."""
    with local_cluster(make_server, masters=3) as formed:
        client = formed.client
        url = f"redis+cluster://{client.get_default_node().name}"
        with sw.Producer.from_url(url, partitions=P) as producer:
            producer.send_many(STREAM, [{"i": i} for i in range(20)],
                               keys=[f"c-{i}" for i in range(20)])
        for name in NAMES:
            client.xgroup_create(name, GROUP, id="0", mkstream=True)
        out = cli("inspect", STREAM, "--partitions", "4", "--json", "--url", url)
        assert out.exit_code == 0, out.output
        doc = json.loads(out.stdout)
        nodes = [p["node"] for p in doc["partitions"]]
        assert nodes == [client.get_node_from_key(n).name for n in NAMES]
        assert len(set(nodes)) >= 2 and doc["length"] == 20
        assert doc["groups"][0]["lag"] == 20
        human = cli("inspect", STREAM, "--partitions", "4", "--url", url)
        assert row(human.stdout, "3")[2] == nodes[3]
        dlq = cli("dlq", "list", STREAM, "--partitions", "4", "--url", url)
        assert dlq.exit_code == 0 and "0 shown" in dlq.output, dlq.output


def test_inspect_adds_up_the_partitions_outboxes(redis_url: str, r: redis.Redis) -> None:
    """Each partition has its own outbox (jobs its handlers sent to other Cluster slots):
    `inspect --partitions` shows each one's and their sum."""
    with sw.Producer.from_url(redis_url, partitions=P) as producer:
        producer.send_many(STREAM, [{"i": i} for i in range(8)], keys=KEYS[:8])
    for i, n in ((0, 2), (2, 3)):
        for _ in range(n):
            r.xadd(StreamKeys.for_stream(NAMES[i]).outbox, {"t": b"receipts", "d": b"x"})
    doc = json.loads(cli("inspect", STREAM, "--partitions", "4", "--json",
                         "--url", redis_url).stdout)
    assert [p["stats"]["outbox"] for p in doc["partitions"]] == [2, 0, 3, 0]
    assert doc["outbox"] == 5
    human = cli("inspect", STREAM, "--partitions", "4", "--url", redis_url)
    assert row(human.stdout, "8")[6] == "5"  # totals: ..., delayed, dead, outbox
