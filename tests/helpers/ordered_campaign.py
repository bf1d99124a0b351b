"""The ordered-mode campaign, on one server or on a cluster: 3 worker processes, retries,
a dead-lettered job, one process SIGKILLed mid-run; then every order key's effect log must
be exactly its jobs, in order, each once (the dead-lettered one absent). `check_order`
judges such logs against what a producer was told stored (the nemesis's ordered campaign,
tests/faults/test_nemesis_cluster.py, uses it too)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import streamwork as sw
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names, partition_of
from streamwork.testing import wait_for
from tests.workers.ordered import OrderLog, log_key

KEYS = 12  #: order keys
PER_KEY = 25  #: jobs per order key


def expected_logs() -> dict[str, list[int]]:
    """What each order key's log must hold: its sequence numbers, in order, without the
    dead-lettered job (seq 10 of key o3)."""
    return {f"o{k}": [s for s in range(PER_KEY) if (k, s) != (3, 10)] for k in range(KEYS)}


def payload(k: int, s: int) -> dict[str, Any]:
    p: dict[str, Any] = {"seq": s, "sleep": 0.004}
    if s % 7 == 2:
        p["fail"] = 1  # retried once, in place: the key's later jobs wait for it
    if (k, s) == (3, 10):
        p["dead"] = True  # dead-lettered: o3's later jobs then go on
    return p


def run_campaign(url: str, client: Any,
                 spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> dict[str, Any]:
    """Send the jobs in two halves around a SIGKILL of one of three worker processes;
    return what the logs and the stream say (the caller asserts)."""
    parts = OrderLog.partitions
    names = partition_names(OrderLog.stream, parts)
    producer = sw.Producer.from_url(url, partitions=parts)
    jobs = [(k, s) for s in range(PER_KEY) for k in range(KEYS)]  # interleaved keys
    half = len(jobs) // 2
    procs = [spawn_worker("tests.workers.ordered:OrderLog", url) for _ in range(3)]

    def logged() -> int:
        return sum(client.llen(log_key(names[partition_of(f"o{k}", parts)], f"o{k}"))
                   for k in range(KEYS))

    def send(batch: list[tuple[int, int]]) -> None:
        producer.send_many(OrderLog.stream, [payload(k, s) for k, s in batch],
                           keys=[f"job-{k}-{s}" for k, s in batch],
                           order_keys=[f"o{k}" for k, _ in batch])

    try:
        send(jobs[:half])
        wait_for(lambda: logged() >= half // 3, timeout=60,
                 message="the workers did not get going")
        os.kill(procs[0].pid, signal.SIGKILL)  # mid-run: it owns partitions, holds jobs
        procs[0].wait()
        send(jobs[half:])
        total = sum(len(v) for v in expected_logs().values())
        wait_for(lambda: logged() >= total, timeout=90,
                 message="not every job took effect after the SIGKILL")
        alive = [p.poll() is None for p in procs[1:]]
        logs = {f"o{k}": [int(x) for x in client.lrange(
            log_key(names[partition_of(f"o{k}", parts)], f"o{k}"), 0, -1)]
            for k in range(KEYS)}
        dead = sum(client.xlen(StreamKeys.for_stream(n).dead) for n in names)
        return {"logs": logs, "alive": alive, "dead": dead}
    finally:
        producer.close()


@dataclass
class OrderVerdict:
    """Per order key, what its effect log got wrong (only keys with something wrong)."""

    lost: dict[str, list[int]] = field(default_factory=dict)  # told stored, never applied
    twice: dict[str, list[int]] = field(default_factory=dict)  # applied more than once
    #: (seq, the later-sent seq applied before it): applied out of enqueue order
    out_of_order: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    ghosts: dict[str, list[int]] = field(default_factory=dict)  # applied, never sent

    def counts(self) -> dict[str, int]:
        return {name: sum(len(v) for v in getattr(self, name).values())
                for name in ("lost", "twice", "out_of_order", "ghosts")}

    def problems(self) -> list[str]:
        """One line per kind of wrong, e.g. ``3 jobs lost: {...}`` (the jobs by key)."""
        return [f"{n} jobs {name.replace('_', ' ')}: "
                f"{dict(list(getattr(self, name).items())[:4])}"
                for name, n in self.counts().items() if n]


def check_order(told: dict[str, list[int]], uncertain: dict[str, set[int]],
                logs: dict[str, list[int]]) -> OrderVerdict:
    """Judge each order key's effect log (the ``seq`` of each job, in the order they took
    effect) against ``told``: the seqs the producer was told stored. A key's seqs grow in
    the order they were sent, one send returning before the next began, so that is their
    enqueue order. The seqs in ``uncertain`` (a send that raised: maybe stored) may be
    there or not, but in order too."""
    verdict = OrderVerdict()
    for key in sorted(set(told) | set(logs)):
        sent, log = told.get(key, []), logs.get(key, [])
        known = set(sent) | uncertain.get(key, set())
        seen: set[int] = set()
        latest = -1  # the latest-sent seq applied so far
        for seq in log:
            if seq in seen:
                verdict.twice.setdefault(key, []).append(seq)
                continue
            seen.add(seq)
            if seq not in known:
                verdict.ghosts.setdefault(key, []).append(seq)
                continue
            if seq < latest:
                verdict.out_of_order.setdefault(key, []).append((seq, latest))
            latest = max(latest, seq)
        missing = [seq for seq in sent if seq not in seen]
        if missing:
            verdict.lost[key] = missing
    return verdict
