"""Nemesis on a Redis Cluster: ordered mode (``ordered = True``, 6 partitions) on 3 masters
with a replica each, under a seeded randomized campaign.

Three ``streamwork run tests.workers.nemesis:NemesisOrdered`` processes serve a partitioned
stream while a producer thread sends jobs (single sends and ``send_many`` batches) for 12
order keys, each key's jobs numbered 0, 1, 2, ... in the order they are sent; 1 job in 20
fails its first attempt (a retry in place, which the key's later jobs must wait for). Each
job's effect is a staged ``RPUSH`` of its number onto its key's log. A nemesis thread,
driven by ``random.Random(seed)``, keeps doing one of: SIGKILL a worker (a supervisor
restarts it), SIGSTOP a worker briefly (well under its visibility timeout: a paused owner
past its lease may overlap with the next owner, which the README says ordered mode does not
promise to order), CLIENT PAUSE a master ~1 s, and SIGKILL a master: its replica takes
over, then the old master is restarted and rejoins as the new master's replica, so the
next kill finds every master with a replica again. The first master kill is forced a
quarter into the campaign if the draws have not made one by then.

Replication is asynchronous, so a failover loses whatever the dead master acknowledged and
its replica lacked (tests/test_cluster_failover.py measures it). Here the kill is made with
nothing to lose: ``cluster_util.kill_master_in_sync`` pauses the master's writes (CLIENT
PAUSE WRITE), waits until the replica has the master's whole replication stream, then
SIGKILLs it; so the expected loss is 0, and the test asserts it. The verdict (CHECKS):

* once: per order key, every job the producer was told stored took effect exactly once
  (`tests.helpers.ordered_campaign.check_order`); nothing else took effect;
* order: ... in the order sent (see STRICT_ORDER for a run where only this fails);
* failover loss: every told-stored job's entry (or its done record) is still there, 0 lost;
* drained: every partition read and acknowledged, nothing waiting;
* workers: no worker exited on its own.

The figures (jobs, faults by kind, failover times, lost, twice, out of order, the failover
loss) are printed (``pytest -s``) and written to ``$STREAMWORK_NEMESIS_REPORT_DIR`` (default
the temp dir) as ``streamwork-nemesis-cluster-<seed>.json``. Seed:
``STREAMWORK_NEMESIS_SEED``; length: ``STREAMWORK_NEMESIS_CLUSTER_SECONDS`` (default 15);
``STREAMWORK_SOAK=1`` runs the long variant (``STREAMWORK_SOAK_SECONDS``, default 1800).
Another kind of fault (e.g. cancels) is a function in `_actions` with a weight in WEIGHTS;
another checker a function of the `Evidence` in CHECKS.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.cluster

import streamwork as sw
from streamwork._wire.codec import BODY_FIELD, decode_body
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names, partition_of
from streamwork.errors import DecodeError
from streamwork.testing import wait_for
from tests.helpers.cluster_util import LocalCluster, kill_master_in_sync, local_cluster, rejoin
from tests.helpers.nemesis_kit import Action, Faults, Supervisor, publish, run_nemesis
from tests.helpers.ordered_campaign import OrderVerdict, check_order
from tests.workers.nemesis import ORDERED_GROUP, ORDERED_STREAM, NemesisOrdered
from tests.workers.ordered import log_key

pytestmark = pytest.mark.cluster

TARGET = "tests.workers.nemesis:NemesisOrdered"
PARTITIONS = NemesisOrdered.partitions
NAMES = partition_names(ORDERED_STREAM, PARTITIONS)
SEED = int(os.environ.get("STREAMWORK_NEMESIS_SEED", "20250611"))
SECONDS = float(os.environ.get("STREAMWORK_NEMESIS_CLUSTER_SECONDS", "15"))
SOAK_SECONDS = float(os.environ.get("STREAMWORK_SOAK_SECONDS", "1800"))
WORKERS = 3
ORDER_KEYS = [f"o{k}" for k in range(12)]
RATE = 100.0  #: sends per second the producer aims at
BATCH_EVERY, BATCH = 25, 24  #: every 25th send is a send_many of 24 jobs
FAIL_ONE_IN = 20  #: one job in 20 fails its first attempt (retried in place)
STALL = (0.2, 0.5)  #: s a worker is SIGSTOPped: well under its visibility timeout
SETTLE_TIMEOUT = 120.0
VT = NemesisOrdered.visibility_timeout
assert STALL[1] < VT / 3  # the owner's lease (renewed every VT/3) outlives the pause

#: nemesis actions and their weights;
#: STREAMWORK_NEMESIS_CLUSTER_ACTIONS="kill_worker,kill_master" narrows them
WEIGHTS = {"kill_worker": 3, "stall_worker": 2, "pause_master": 1, "kill_master": 1}
if os.environ.get("STREAMWORK_NEMESIS_CLUSTER_ACTIONS"):
    WEIGHTS = {a: WEIGHTS[a]
               for a in os.environ["STREAMWORK_NEMESIS_CLUSTER_ACTIONS"].split(",")}

LOOK_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)
#: Ordered mode does not keep every order key's enqueue order through a master failover
#: yet: in about half of the 20-s runs (one or two master kills each), a few jobs of some
#: keys took effect after later jobs of their key (none lost, none twice; without master
#: kills none did). Until that is fixed a run whose only problem is that ends as an
#: expected failure (xfail, with the figures and the jobs concerned);
#: STREAMWORK_NEMESIS_STRICT_ORDER=1 makes it fail. Every other problem fails the test.
STRICT_ORDER = bool(os.environ.get("STREAMWORK_NEMESIS_STRICT_ORDER"))
OUT_OF_ORDER = " jobs out of order: "  #: how `OrderVerdict.problems` says it


@dataclass
class Campaign:
    seed: int
    seconds: float
    faults: Faults = field(default_factory=Faults)
    #: per order key, the seqs the producer was told stored, in the order sent
    told: dict[str, list[int]] = field(
        default_factory=lambda: {k: [] for k in ORDER_KEYS})
    #: per order key, the seqs whose send raised (maybe stored)
    uncertain: dict[str, set[int]] = field(
        default_factory=lambda: {k: set() for k in ORDER_KEYS})
    failovers: list[float] = field(default_factory=list)  # s from SIGKILL to a whole cluster
    settled_in: float | None = None
    errors: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    stop_producing: threading.Event = field(default_factory=threading.Event)
    stop_nemesis: threading.Event = field(default_factory=threading.Event)

    @property
    def jobs(self) -> int:
        return sum(len(v) for v in self.told.values())

    def note(self, what: str) -> None:
        self.faults.note(what)


def _client(cluster: LocalCluster) -> redis.cluster.RedisCluster:
    """A cluster client seeded with the current masters (the first ones may be dead)."""
    return redis.cluster.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode("127.0.0.1", m.port) for m in cluster.masters],
        socket_timeout=10)


def _seed(cluster: LocalCluster) -> str:
    """A URL for a worker started now: a node that runs (a worker whose only seed node is
    down cannot find the cluster, and exits)."""
    node = next(s for s in cluster.servers if s.pid is not None)
    return f"redis+cluster://127.0.0.1:{node.port}"


def _look(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except LOOK_ERRORS:
        return default


def _logs(client: Any) -> dict[str, list[int]]:
    return {k: [int(x) for x in client.lrange(
        log_key(NAMES[partition_of(k, PARTITIONS)], k), 0, -1)] for k in ORDER_KEYS}


def _produce(c: Campaign, url: str) -> None:
    """Jobs for the order keys, each key's numbered in send order; a job counts as told
    stored once its send returned."""
    rnd = random.Random(c.seed * 7919 + 2)
    seqs: Counter[str] = Counter()

    def job(key: str) -> tuple[str, int, dict[str, Any]]:
        seq = seqs[key]
        seqs[key] += 1
        payload: dict[str, Any] = {"seq": seq, "sleep": round(rnd.uniform(0.0, 0.01), 3)}
        if rnd.randrange(FAIL_ONE_IN) == 0:
            payload["fail"] = 1
        return key, seq, payload

    try:
        with sw.Producer.from_url(url, partitions=PARTITIONS, retry_timeout=60) as p:
            calls = 0
            while not c.stop_producing.is_set():
                calls += 1
                if calls % BATCH_EVERY == 0:
                    jobs = [job(rnd.choice(ORDER_KEYS)) for _ in range(BATCH)]
                else:
                    jobs = [job(rnd.choice(ORDER_KEYS))]
                try:
                    p.send_many(ORDERED_STREAM, [pl for _, _, pl in jobs],
                                keys=[f"{k}-{s}" for k, s, _ in jobs],
                                order_keys=[k for k, _, _ in jobs])
                except Exception as exc:  # maybe stored, maybe not
                    for k, s, _ in jobs:
                        c.uncertain[k].add(s)
                    c.errors.append(f"producer: send of {len(jobs)} jobs failed: {exc!r}")
                else:
                    for k, s, _ in jobs:
                        c.told[k].append(s)
                time.sleep(1 / RATE)
    except BaseException as exc:  # reported by the main thread
        c.errors.append(f"producer died: {exc!r}")


def _actions(c: Campaign, sup: Supervisor,
             cluster: LocalCluster) -> dict[str, tuple[int, Action]]:
    """The nemesis's faults (those in WEIGHTS). A new kind (e.g. a "cancel" of a random
    recent job, noted in the campaign for a checker in CHECKS) goes here and in WEIGHTS."""

    def kill_worker(rnd: random.Random) -> str | None:
        slot = rnd.randrange(WORKERS)
        pid = sup.signal(slot, signal.SIGKILL)
        return f"SIGKILL worker slot {slot} pid {pid}" if pid else None

    def stall_worker(rnd: random.Random) -> str | None:
        slot, pause = rnd.randrange(WORKERS), rnd.uniform(*STALL)
        pid = sup.stall(slot, pause, c.stop_nemesis)
        return f"SIGSTOP worker slot {slot} pid {pid} for {pause:.2f}s, SIGCONT" if pid else None

    def pause_master(rnd: random.Random) -> str:
        master = rnd.choice(cluster.masters)
        direct = redis.Redis(host="127.0.0.1", port=master.port, socket_timeout=10)
        try:
            direct.client_pause(1000)
        finally:
            direct.close()
        return f"CLIENT PAUSE 1000 ms on master {master.port}"

    def kill_master(rnd: random.Random) -> str:
        victim = rnd.choice(cluster.masters)
        began = time.monotonic()
        promoted, offset = kill_master_in_sync(cluster, victim, timeout=30)
        c.failovers.append(time.monotonic() - began)
        c.note(f"SIGKILL master {victim.port} (its replica in sync at offset {offset}); "
               f"replica {promoted.port} took over in {c.failovers[-1]:.1f}s")
        rejoin(cluster, victim, promoted)
        return f"old master {victim.port} rejoined as the replica of {promoted.port}"

    every: dict[str, Action] = {"kill_worker": kill_worker, "stall_worker": stall_worker,
                                "pause_master": pause_master, "kill_master": kill_master}
    return {name: (weight, every[name]) for name, weight in WEIGHTS.items()}


@dataclass
class Evidence:
    """What the checkers judge: the campaign's record, the effect logs, the partitions'
    state, the supervisor's record of the processes."""

    c: Campaign
    logs: dict[str, list[int]]
    verdict: OrderVerdict
    survived: set[str]  # job keys whose entry (or done record) is still in their partition
    drained: bool
    sup: Supervisor
    left: list[str]  # what each partition has left (when not drained)


def _survivors(client: Any, c: Campaign) -> set[str]:
    """Told-stored job keys that survived the failovers: their entry is still in their
    partition (entries are never trimmed here), or their done record is."""
    there: set[str] = set()
    for name in NAMES:
        for _, fields in client.xrange(name):
            try:
                there.add(decode_body(fields[BODY_FIELD]).key)
            except DecodeError:
                continue
    for key, seqs in c.told.items():
        name = NAMES[partition_of(key, PARTITIONS)]
        for seq in seqs:
            job = f"{key}-{seq}"
            if job not in there:
                record = client.get(StreamKeys.for_stream(name).group(ORDERED_GROUP).job(job))
                if record is not None and record[:1] == b"D":
                    there.add(job)
    return there


def _check_once(ev: Evidence) -> list[str]:
    """Each order key's told-stored jobs applied once each; nothing else applied."""
    ev.c.figures.update(ev.verdict.counts())
    return [p for p in ev.verdict.problems() if OUT_OF_ORDER not in p]


def _check_order(ev: Evidence) -> list[str]:
    """Each order key's jobs applied in the order they were sent."""
    return [p for p in ev.verdict.problems() if OUT_OF_ORDER in p]


def _check_failover_loss(ev: Evidence) -> list[str]:
    """Nothing the producer was told stored died with a master (its replica was in sync)."""
    lost = [f"{k}-{s}" for k, seqs in ev.c.told.items() for s in seqs
            if f"{k}-{s}" not in ev.survived]
    print(f"\nfailover loss (in-sync replica, {len(ev.c.failovers)} master kills): "
          f"{len(lost)} of {ev.c.jobs} acknowledged sends")
    ev.c.figures.update(failover_loss=len(lost))
    return [f"{len(lost)} told-stored jobs died with a master although its replica was in "
            f"sync, e.g. {lost[:8]}"] if lost else []


def _check_drained(ev: Evidence) -> list[str]:
    """Every partition read and acknowledged, nothing waiting for a retry."""
    ev.c.figures.update(drained=ev.drained)
    return [] if ev.drained else [
        "the partitions did not drain (pending, unread or waiting): " + "; ".join(ev.left)]


def _fields(info: Any) -> dict[str, Any]:
    """One group of an XINFO GROUPS reply with str field names (a cluster pipeline leaves
    them bytes, in a flat list)."""
    pairs = info.items() if isinstance(info, dict) else zip(info[::2], info[1::2], strict=True)
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in pairs}


def _partition_left(client: Any, name: str) -> str | None:
    """What partition ``name`` has left to do, or None when it is idle: entries pending or
    after the group's last-delivered id, in the stream and in the group's retry stream, and
    jobs delayed or waiting for a retry. Looked at in one MULTI (one hash slot), and not by
    XINFO's ``lag``, which is a counter Redis keeps, not a look at the entries."""
    keys = StreamKeys.for_stream(name)
    gkeys = keys.group(ORDERED_GROUP)
    pipe = client.pipeline(transaction=True)
    for stream in (name, gkeys.retry):
        pipe.exists(stream)
        pipe.xinfo_groups(stream)
        pipe.xrevrange(stream, count=1)
    pipe.zcard(keys.delayed)
    pipe.zcard(gkeys.retries)
    got = pipe.execute(raise_on_error=False)
    left = []
    for stream, (exists, groups, last) in zip((name, gkeys.retry), (got[0:3], got[3:6]),
                                              strict=True):
        if not exists:
            continue
        if isinstance(groups, Exception):
            left.append(f"{stream}: {groups!r}")
            continue
        group = next((g for g in map(_fields, groups) if g["name"] in (
            ORDERED_GROUP, ORDERED_GROUP.encode())), None)
        if group is None:
            left.append(f"{stream}: no group")
            continue
        last_id = last[0][0] if last else b"0-0"
        if group["pending"] or group["last-delivered-id"] != last_id:
            left.append(f"{stream}: pending {group['pending']}, last delivered "
                        f"{group['last-delivered-id']!r}, last entry {last_id!r} (entries-read "
                        f"{group.get('entries-read')}, lag {group.get('lag')})")
    if got[6] or got[7]:
        left.append(f"{name}: delayed {got[6]}, waiting for a retry {got[7]}")
    return "; ".join(left) or None


def _left(client: Any) -> list[str]:
    """What each partition that is not idle has left (see `_partition_left`), with its
    first pending entries: their job key, consumer, idle time and delivery count."""
    out = []
    for name in NAMES:
        try:
            what = _partition_left(client, name)
            if what is None:
                continue
            jobs = []
            for p in client.xpending_range(name, ORDERED_GROUP, "-", "+", 5):
                entry = client.xrange(name, p["message_id"], p["message_id"])
                key = decode_body(entry[0][1][BODY_FIELD]).key if entry else "<gone>"
                jobs.append(f"{key} ({p['consumer'].decode()}, idle {p['time_since_delivered']}"
                            f" ms, delivered {p['times_delivered']}x)")
            out.append(f"{what}; first pending: {jobs}")
        except (*LOOK_ERRORS, KeyError, DecodeError) as exc:
            out.append(f"{name}: could not look ({exc!r})")
    return out


#: the checkers, each a function of the evidence returning problems (and adding figures)
CHECKS: list[Callable[[Evidence], list[str]]] = [_check_once, _check_order,
                                                  _check_failover_loss, _check_drained]


def _campaign(make_server: Callable[..., Any],
              spawn_worker: Callable[..., subprocess.Popen[bytes]],
              tmp_path: Path, seconds: float, seed: int) -> None:
    print(f"\nnemesis cluster: seed={seed} (STREAMWORK_NEMESIS_SEED), {seconds:g}s of faults")
    c = Campaign(seed, seconds)
    problems: list[str] = []
    with local_cluster(make_server, masters=3, replicas=1, node_timeout_ms=1000,
                       extra_args=["--cluster-replica-validity-factor", "0"]) as cluster:
        sup = Supervisor(spawn_worker, TARGET, lambda: _seed(cluster), tmp_path, c.faults.t0,
                         # INFO: partitions taken and handed back; DEBUG: every job too
                         args=["--log-level", os.environ.get("STREAMWORK_NEMESIS_LOG", "INFO")])
        sup.start(WORKERS)
        producer = threading.Thread(target=_produce, args=(c, cluster.url), daemon=True)
        producer.start()
        try:
            # faults begin once every order key's jobs take effect (every partition served)
            wait_for(lambda: _look(lambda: all(_logs(cluster.client).values()), False), 60,
                     interval=0.1, message="every order key's first job applied")
            c.faults.t0 = sup.t0 = time.monotonic()
            nemesis = threading.Thread(target=run_nemesis, args=(
                _actions(c, sup, cluster), seed, seconds, c.faults, c.stop_nemesis, c.errors),
                kwargs={"first": (seconds / 4, "kill_master") if "kill_master" in WEIGHTS
                        else None}, daemon=True)
            nemesis.start()
            nemesis.join(seconds + 180)
            if nemesis.is_alive():
                c.stop_nemesis.set()
                nemesis.join(60)
                problems.append("the nemesis did not finish its last action in time")
            c.stop_producing.set()
            producer.join(90)
            if producer.is_alive():
                problems.append("producer stuck after the campaign")
            c.faults.note(f"faults over; producer stopped after {c.jobs} jobs told stored, "
                          f"{sum(map(len, c.uncertain.values()))} uncertain")
            client = _client(cluster)
            try:
                told = {k: set(v) for k, v in c.told.items()}

                def settled() -> bool:
                    logs = _logs(client)
                    return (all(told[k] <= set(logs[k]) for k in ORDER_KEYS)
                            and all(_partition_left(client, n) is None for n in NAMES))

                began = time.monotonic()
                try:
                    wait_for(lambda: _look(settled, False), SETTLE_TIMEOUT, interval=0.25,
                             message="every job applied after the faults")
                    c.settled_in = time.monotonic() - began
                    c.faults.note(f"settled in {c.settled_in:.1f}s")
                except AssertionError:
                    problems.append(f"not settled {SETTLE_TIMEOUT:g}s after the faults")
                logs = _logs(client)
                drained = _look(lambda: all(_partition_left(client, n) is None
                                            for n in NAMES), False)
                evidence = Evidence(
                    c, logs, check_order(c.told, c.uncertain, logs), _survivors(client, c),
                    drained, sup, [] if drained else _left(client))
            finally:
                client.close()
            problems += c.errors[:10] + ([f"... and {len(c.errors) - 10} more"]
                                         if len(c.errors) > 10 else [])
            problems += [f"worker pid {e.pid} exited ON ITS OWN with code {e.code} at "
                         f"{e.at:.1f}s (log {e.log})" for e in sup.unexpected_exits()]
            if sup.error is not None:
                problems.append(f"supervisor died: {sup.error!r}")
            for check in CHECKS:
                problems += check(evidence)
        finally:
            c.stop_nemesis.set()
            c.stop_producing.set()
            sup.close()

    c.figures.update(
        seed=seed, faults_seconds=seconds, jobs=c.jobs,
        uncertain=sum(map(len, c.uncertain.values())), faults=dict(c.faults.done),
        faults_skipped=dict(c.faults.skipped),
        failover_seconds=[round(f, 1) for f in c.failovers],
        worker_exits=dict(Counter(e.why for e in sup.exits)), processes_started=sup.spawned,
        settled_in=None if c.settled_in is None else round(c.settled_in, 1),
        problems=len(problems))
    publish("cluster", seed, c.figures)
    if problems:
        report = "\n".join(
            [f"nemesis cluster campaign failed ({c.figures})",
             f"re-run: STREAMWORK_NEMESIS_SEED={seed}", "", "PROBLEMS:",
             *(f"  - {p}" for p in problems), "", "ACTION LOG:", *c.faults.log, "",
             "WORKER EXITS:", *(f"  {e.at:7.2f}s pid {e.pid} code {e.code} {e.why}"
                                for e in sup.exits)])
        if not STRICT_ORDER and all(OUT_OF_ORDER in p for p in problems):
            print(report)
            pytest.xfail(f"known: ordered mode lost enqueue order through a master failover "
                         f"({c.figures.get('out_of_order')} jobs; STREAMWORK_NEMESIS_SEED="
                         f"{seed}; STREAMWORK_NEMESIS_STRICT_ORDER=1 fails instead)")
        pytest.fail(report, pytrace=False)


@pytest.mark.timeout(max(420, SECONDS + 360))
def test_nemesis_ordered_on_a_cluster(make_server: Callable[..., Any],
                                      spawn_worker: Callable[..., subprocess.Popen[bytes]],
                                      tmp_path: Path) -> None:
    """~15 s of faults, a master killed among them: every order key's jobs applied once
    each, in order, nothing lost to the failover (its replica was in sync)."""
    _campaign(make_server, spawn_worker, tmp_path, seconds=SECONDS, seed=SEED)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("STREAMWORK_SOAK"), reason="set STREAMWORK_SOAK=1")
@pytest.mark.timeout(SOAK_SECONDS + 900)
def test_nemesis_ordered_on_a_cluster_soak(
        make_server: Callable[..., Any], spawn_worker: Callable[..., subprocess.Popen[bytes]],
        tmp_path: Path) -> None:
    """The same for ``STREAMWORK_SOAK_SECONDS`` (default 1800) of faults."""
    _campaign(make_server, spawn_worker, tmp_path, seconds=SOAK_SECONDS, seed=SEED)
