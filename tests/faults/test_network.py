"""Network faults, a fault class of their own: two ``streamwork run`` processes
(tests.workers.network:NetWorker, dedup on, effects staged) and a producer, each talking to
one redis-server through its own TCP forwarder (tests/helpers/netfault.py), under load:

* a silent partition (iptables DROP both ways, no reset) of worker A and the producer,
  shorter than the visibility timeout;
* a partition of them longer than the visibility timeout (worker B reclaims A's jobs), which
  heals;
* latency 100 ms +- 30 ms with 2 % loss on every forwarder.

Each checks: nothing lost (every job the producer sent, resending with the same key after a
`SendFailed` as the docs say, is applied), nothing done twice (each staged effect once; a
job is in the stream twice only when its send said "unknown" and it was sent again),
nothing stuck (nothing pending or unread at the end), worker A back to work after the heal
without a restart (timed), ``/readyz`` truthful (A: 503 while cut off, 200 again after the
heal; B: 200 throughout; both 200 under latency), and every send either returned (stored
once) or raised SendFailed within the producer's bound (``send_bound``). Short socket
timeouts (URL options) and visibility timeout keep the module well under a minute; the
figures are printed (``pytest -s``). ``STREAMWORK_SOAK=1`` runs a longer seeded mix of the
three (``STREAMWORK_SOAK_SECONDS``, default 600), marked slow.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._redis.server import RedisServer, free_port
from streamwork._wire.codec import decode_body
from streamwork.testing import stream_idle, wait_for
from tests.helpers.netfault import Forwarder, NetFaults
from tests.workers.network import BY_PID, GROUP, LEDGER, STREAM, NetWorker

TARGET = "tests.workers.network:NetWorker"
SOCKET, CONNECT, RETRY = 1.0, 0.5, 2.0  #: clients' socket/connect timeouts, send retries
QUERY = f"?socket_timeout={SOCKET}&socket_connect_timeout={CONNECT}"
VT = NetWorker.visibility_timeout
RATE = 30.0  #: jobs/s the producer sends: more than one worker handles (4 x 1 / SLEEP)...
SLEEP = 0.15  #: ... as each runs this long, so both workers always have work
#: s a worker may take to notice a partition (its first call to time out) and say 503
DETECT_BOUND = SOCKET + CONNECT + 2.0
BACK_BOUND = 15.0  #: s a healed worker may take to apply a job again
SLACK = 3.0  #: s a busy machine may add to a send's bound
SEED = int(os.environ.get("STREAMWORK_NEMESIS_SEED", "20250611"))
SOAK = os.environ.get("STREAMWORK_SOAK") == "1"
SOAK_SECONDS = float(os.environ.get("STREAMWORK_SOAK_SECONDS", "600"))

Spawn = Callable[..., subprocess.Popen[bytes]]


def readyz(port: int) -> int | None:
    """The status /readyz answers on ``port``; None while nothing answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/readyz")
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except OSError:
        return None
    finally:
        conn.close()


@dataclass
class Sends:
    """What the producer saw: keys acknowledged, SendFailed outcomes, the longest send."""

    acked: list[str] = field(default_factory=list)
    failed: list[tuple[str, str, float]] = field(default_factory=list)  # key, outcome, s
    other: list[str] = field(default_factory=list)  # anything but a clean send/SendFailed
    longest: float = 0.0


class Rig:
    """The server, two workers and the producer, each behind its own forwarder, and the
    samplers of /readyz and of the jobs each worker applied."""

    def __init__(self, server: RedisServer, net: NetFaults, spawn: Spawn,
                 logs: Path) -> None:
        self.server, self.net = server, net
        self.r = redis.Redis.from_url(server.url, socket_timeout=10)
        self.fwd_a, self.fwd_b, self.fwd_p = (net.forwarder(server.port) for _ in range(3))
        self.health = {"A": free_port(), "B": free_port()}
        self.logs = logs
        self.files = {name: (logs / f"worker-{name}.log").open("wb") for name in "AB"}
        self.procs = {
            name: spawn(TARGET, fwd.url + QUERY, "--health-port", str(self.health[name]),
                        stdout=self.files[name])
            for name, fwd in (("A", self.fwd_a), ("B", self.fwd_b))}
        for name, port in self.health.items():
            wait_for(lambda p=port: readyz(p) == 200, 60, interval=0.1,
                     message=f"worker {name} ready")
        self.sends = Sends()
        self.bound = RETRY + 2 * (CONNECT + SOCKET)  #: the producer's send_bound
        self.samples: list[tuple[float, int | None, int | None]] = []  # t, A, B
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._sample, daemon=True)]
        for t in self.threads:
            t.start()

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def applied_by(self, name: str) -> int:
        return int(self.r.hget(BY_PID, str(self.pid(name))) or 0)

    def held_by(self, name: str) -> int:
        """How many deliveries worker ``name`` holds (its consumers' pending entries)."""
        pid = f"-{self.pid(name)}-"
        return sum(int(c["pending"]) for c in self.r.xpending(STREAM, GROUP)["consumers"]
                   if pid in (c["name"].decode() if isinstance(c["name"], bytes)
                              else c["name"]))

    def _produce(self) -> None:
        """Steady load; a key whose send raised SendFailed is sent again with the same key
        (what SendFailed's message says to do) until a send of it returns."""
        with sw.Producer.from_url(self.fwd_p.url + QUERY, retry_timeout=RETRY) as p:
            assert p.send_bound == self.bound
            i, again = 0, []
            while not self.stop.is_set():
                if again:
                    key = again.pop(0)
                else:
                    key, i = f"job-{i}", i + 1
                started = time.monotonic()
                try:
                    p.send(STREAM, {"sleep": SLEEP}, key=key)
                    self.sends.acked.append(key)
                except sw.SendFailed as exc:
                    self.sends.failed.append((key, exc.outcome, time.monotonic() - started))
                    again.append(key)
                except Exception as exc:  # reported by the checks
                    self.sends.other.append(repr(exc))
                    again.append(key)
                took = time.monotonic() - started
                self.sends.longest = max(self.sends.longest, took)
                self.stop.wait(max(0.0, 1 / RATE - took))
            while again:  # the faults are over: every failed key goes in
                key = again.pop(0)
                try:
                    p.send(STREAM, {"sleep": SLEEP}, key=key)
                    self.sends.acked.append(key)
                except sw.SendFailed:
                    again.append(key)

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), readyz(self.health["A"]),
                                 readyz(self.health["B"])))
            self.stop.wait(0.1)

    def partition(self, seconds: float) -> dict[str, float]:
        """Cut worker A and the producer off for ``seconds``; the figures: how long A took
        to say 503, to say 200 again after the heal, and to apply a job again."""
        before = self.applied_by("A")
        wait_for(lambda: self.applied_by("A") > before, 30, interval=0.05,
                 message="worker A applying jobs before the partition")
        held = wait_for(lambda: self.held_by("A"), 30, interval=0.01,
                        message="worker A holding jobs as it is cut off")
        cut = time.monotonic()
        with self.net.partition(self.fwd_a, self.fwd_p):
            detected = wait_for(
                lambda: self._status_since(cut, 1, 503), DETECT_BOUND + SLACK, interval=0.05,
                message="worker A's /readyz saying 503 in the partition")
            self.stop.wait(max(0.0, cut + seconds - time.monotonic()))
            during = [s for s in self.samples if s[0] >= detected]
        healed = time.monotonic()
        applied = self.applied_by("A")
        ready = wait_for(lambda: self._status_since(healed, 1, 200), BACK_BOUND, interval=0.05,
                         message="worker A's /readyz saying 200 after the heal")
        wait_for(lambda: self.applied_by("A") > applied, BACK_BOUND, interval=0.05,
                 message="worker A applying jobs again after the heal")
        back = time.monotonic()
        lying = [s for s in during if s[1] == 200]
        assert not lying, f"A's /readyz said 200 while it could not reach Redis: {lying[:3]}"
        return {"partition_s": round(healed - cut, 2), "a_held_at_cut": held,
                "detected_s": round(detected - cut, 2),
                "ready_after_heal_s": round(ready - healed, 2),
                "back_to_work_s": round(back - healed, 2)}

    def _status_since(self, since: float, column: int, status: int) -> float | None:
        """When A's (column 1) or B's (2) /readyz first answered ``status`` after ``since``."""
        return next((s[0] for s in self.samples if s[0] >= since and s[column] == status),
                    None)

    def finish(self, started: float) -> dict[str, Any]:
        """Stop the load, let everything settle; check and return the figures."""
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not any(t.is_alive() for t in self.threads), "producer or sampler stuck"
        settled = wait_for(
            lambda: stream_idle(self.r, STREAM, GROUP) and time.monotonic(), 60,
            interval=0.1, message="every job applied and acknowledged")
        ledger = {k.decode(): int(v) for k, v in self.r.hgetall(LEDGER).items()}
        acked = set(self.sends.acked)
        lost = sorted(acked - set(ledger))
        twice = {k: n for k, n in ledger.items() if n > 1}
        stuck = int(self.r.xpending(STREAM, GROUP)["pending"])
        copies = Counter(decode_body(fields[b"d"]).key for _, fields in self.r.xrange(STREAM))
        # a key is in the stream twice only if a send of it said "unknown" and was resent
        # (the caller's resend is a send of its own; dedup made it harmless above)
        unknown = {f[0] for f in self.sends.failed if f[1] == "unknown"}
        resent = {k for k, n in copies.items() if n > 1}
        stored_twice = {k: copies[k] for k in resent - unknown}
        b_down = [s for s in self.samples if s[2] != 200]
        late = [f for f in self.sends.failed if f[2] > self.bound + SLACK]
        figures = {
            "jobs": len(acked), "applied": len(ledger), "lost": len(lost),
            "twice": len(twice), "stored_again_after_unknown": len(resent & unknown),
            "stuck": stuck,
            "send_failed": {o: sum(1 for f in self.sends.failed if f[1] == o)
                            for o in ("unknown", "not stored")},
            "longest_send_s": round(self.sends.longest, 2), "send_bound_s": self.bound,
            "settled_s": round(settled - started, 1),
            "a_applied": self.applied_by("A"), "b_applied": self.applied_by("B"),
        }
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"worker {name} exited: see {self.logs}"
        assert not lost, f"{len(lost)} acknowledged jobs never applied: {lost[:5]}"
        assert not twice, f"jobs applied more than once: {dict(list(twice.items())[:5])}"
        assert set(ledger) <= acked, "a job applied that no send acknowledged"
        assert not stored_twice, f"one send stored a job twice: {list(stored_twice)[:5]}"
        unknowns = Counter(f[0] for f in self.sends.failed if f[1] == "unknown")
        assert all(copies[k] <= 1 + unknowns[k] for k in resent), "stored twice by one send"
        assert stuck == 0
        assert not self.sends.other, f"sends failed otherwise: {self.sends.other[:3]}"
        assert not late, f"SendFailed past the bound of {self.bound} s: {late[:3]}"
        assert self.sends.longest <= self.bound + SLACK
        assert not b_down, f"worker B (never cut off) said {b_down[:3]} on /readyz"
        return figures

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        self.r.close()
        for f in self.files.values():
            f.close()


@pytest.fixture(name="net")
def _net() -> Iterator[NetFaults]:
    with NetFaults(seed=SEED) as net:
        yield net


@pytest.fixture(name="rig")
def _rig(make_server: Callable[..., RedisServer], net: NetFaults, spawn_worker: Spawn,
         tmp_path: Path) -> Iterator[Rig]:
    net.require_iptables()
    rig = Rig(make_server(), net, spawn_worker, tmp_path)
    yield rig
    rig.close()


def _report(name: str, figures: dict[str, Any]) -> None:
    print(f"\nnetwork fault {name}: {json.dumps(figures)}")


def test_silent_partition_shorter_than_the_visibility_timeout(rig: Rig) -> None:
    """A and the producer cut off (DROP both ways) for less than a visibility timeout:
    A says 503 within a socket timeout or so, keeps its leases, and is back to work (200,
    applying jobs) soon after the heal; nothing lost, twice or stuck."""
    started = time.monotonic()
    faults = rig.partition(VT * 0.6)
    figures = {**rig.finish(started), **faults}
    _report("short partition", figures)


def test_silent_partition_longer_than_the_visibility_timeout_heals(rig: Rig) -> None:
    """Cut off for more than two visibility timeouts: B reclaims and applies what A held
    (A's late completions are refused: nothing applied twice); after the heal A serves
    again without a restart."""
    started = time.monotonic()
    faults = rig.partition(VT * 2 + 1)
    figures = {**rig.finish(started), **faults}
    _report("long partition", figures)


def test_latency_and_loss(rig: Rig) -> None:
    """100 ms +- 30 ms each way with 2 % of chunks held back a retransmission timeout, on
    both workers and the producer, for a while: everything applied once, nothing stuck,
    both workers ready throughout (Redis answers, slowly)."""
    started = time.monotonic()
    for fwd in (rig.fwd_a, rig.fwd_b, rig.fwd_p):
        fwd.impair()
    impaired = time.monotonic()
    rig.stop.wait(8.0)
    for fwd in (rig.fwd_a, rig.fwd_b, rig.fwd_p):
        fwd.heal()
    during = [s for s in rig.samples if s[0] >= impaired]
    figures = rig.finish(started)
    a_down = [s for s in during if s[1] != 200]
    assert not a_down, f"worker A said {a_down[:3]} on /readyz under latency"
    figures["impaired_s"] = 8.0
    _report("latency and loss", figures)


@pytest.mark.slow
@pytest.mark.skipif(not SOAK, reason="set STREAMWORK_SOAK=1 for the soak variant")
@pytest.mark.timeout(SOAK_SECONDS + 300)
def test_network_soak(rig: Rig) -> None:
    """A seeded mix of the three faults for STREAMWORK_SOAK_SECONDS, then the same checks."""
    rnd = random.Random(SEED)
    started = time.monotonic()
    faults: list[dict[str, Any]] = []
    fwds: list[Forwarder] = [rig.fwd_a, rig.fwd_b, rig.fwd_p]
    while time.monotonic() - started < SOAK_SECONDS:
        kind = rnd.choice(["short", "long", "latency"])
        if kind == "latency":
            for fwd in fwds:
                fwd.impair()
            rig.stop.wait(rnd.uniform(3, 10))
            for fwd in fwds:
                fwd.heal()
            faults.append({"kind": kind})
        else:
            seconds = VT * (0.6 if kind == "short" else 2) + rnd.uniform(0, 1)
            faults.append({"kind": kind, **rig.partition(seconds)})
        rig.stop.wait(rnd.uniform(1, 4))
    figures = rig.finish(started)
    figures["faults"] = len(faults)
    figures["back_to_work_s_max"] = max((f.get("back_to_work_s", 0) for f in faults),
                                        default=0)
    _report("soak", figures)
