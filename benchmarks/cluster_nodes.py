"""A local Redis Cluster of ``masters`` masters (no replicas) for the cluster benchmark.

:func:`local_cluster` starts ``masters`` cluster-enabled ``redis-server`` processes on free
loopback ports (each in its own temporary directory, ended by its pid), joins them and
yields a :class:`BenchCluster` only once it is fully formed: every node says
``cluster_state:ok``, ``cluster_slots_assigned:16384`` and ``cluster_slots_ok:16384``,
knows every other node, and every node's ``CLUSTER SLOTS`` is the same map covering all
16384 slots.

Three masters or more are joined by ``redis-cli --cluster create ... --cluster-yes``.
``redis-cli`` refuses fewer than three masters, so one and two masters get the same layout
by hand: the slot ranges ``redis-cli`` would compute (contiguous, equal), ``CLUSTER
SET-CONFIG-EPOCH``, ``CLUSTER ADDSLOTSRANGE``, then ``CLUSTER MEET``. A small equivalent of
``tests/helpers/cluster_util.py`` (which needs pytest, so the benchmark cannot import it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import redis
from redis.crc import key_slot

from streamwork._redis.server import RedisServer, find_server_binary, free_port
from streamwork.errors import BenchError

__all__ = ["SLOTS", "BenchCluster", "cluster_cli", "local_cluster", "slot_ranges"]

SLOTS: Final = 16384
FORM_TIMEOUT: Final = 30.0  #: seconds a cluster may take to form


def cluster_cli() -> str | None:
    """redis-cli on PATH (or the valkey-cli beside the server binary), if any."""
    found = shutil.which("redis-cli")
    if found:
        return found
    sibling = Path(find_server_binary()).with_name("valkey-cli")
    return str(sibling) if sibling.exists() else None


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The slot range (first, last) of each master, as ``redis-cli --cluster create``
    computes them (``clusterManagerCommandCreate``: ``lround`` of a float cursor)."""
    per = SLOTS / masters
    out, first, cursor = [], 0, 0.0
    for i in range(masters):
        last = int(cursor + per - 1 + 0.5)  # lround, the values are never negative
        if last > SLOTS or i == masters - 1:
            last = SLOTS - 1
        last = max(last, first)
        out.append((first, last))
        first, cursor = last + 1, cursor + per
    return out


@dataclass
class BenchCluster:
    """A formed cluster: its masters (in slot order) and one plain client per master."""

    servers: list[RedisServer]
    nodes: list[redis.Redis]
    ranges: list[tuple[int, int]]

    @property
    def masters(self) -> int:
        return len(self.servers)

    @property
    def url(self) -> str:
        """A ``redis+cluster://`` URL for streamwork (seeded with the first master)."""
        return f"redis+cluster://127.0.0.1:{self.servers[0].port}"

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.servers if s.pid is not None]

    def master_of(self, key: str) -> int:
        """Which master (0-based, slot order) holds ``key``."""
        slot = key_slot(key.encode())
        return next(i for i, (lo, hi) in enumerate(self.ranges) if lo <= slot <= hi)

    def flushall(self) -> None:
        for node in self.nodes:
            node.flushall()

    def redis_cpu(self) -> list[float]:
        """CPU seconds (user + system) each master has used so far."""
        out = []
        for node in self.nodes:
            info: dict[str, Any] = node.info("cpu")
            out.append(float(info["used_cpu_sys"]) + float(info["used_cpu_user"]))
        return out

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def _cmd(node: redis.Redis, *args: str | int) -> Any:
    """A command's raw reply (redis-py leaves execute_command untyped)."""
    return node.execute_command(*args)  # type: ignore[no-untyped-call]


def _info(node: redis.Redis, section: str) -> dict[str, str]:
    raw = _cmd(node, "CLUSTER", section)
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _slot_map(node: redis.Redis) -> list[tuple[int, int, int]]:
    """CLUSTER SLOTS as sorted (first, last, master port)."""
    return sorted((int(e[0]), int(e[1]), int(e[2][1]))
                  for e in _cmd(node, "CLUSTER", "SLOTS"))


def _not_ready(nodes: Sequence[redis.Redis], ports: Sequence[int]) -> str | None:
    """Why the cluster is not fully formed yet, or None once it is."""
    maps = []
    for port, node in zip(ports, nodes, strict=True):
        info = _info(node, "INFO")
        for name, want in (("cluster_state", "ok"), ("cluster_slots_assigned", str(SLOTS)),
                           ("cluster_slots_ok", str(SLOTS)),
                           ("cluster_known_nodes", str(len(nodes)))):
            if info.get(name) != want:
                return f"node {port}: {name}:{info.get(name)} (want {want})"
        maps.append(_slot_map(node))
    if any(m != maps[0] for m in maps):
        return f"the nodes' CLUSTER SLOTS disagree: {maps}"
    if sum(hi - lo + 1 for lo, hi, _ in maps[0]) != SLOTS or {p for *_, p in maps[0]} != set(
            ports):
        return f"CLUSTER SLOTS does not cover {SLOTS} slots over every master: {maps[0]}"
    return None


def _start(masters: int) -> list[RedisServer]:
    servers = []
    with ExitStack() as undo:
        for _ in range(masters):
            port = free_port()
            bus = free_port()
            while bus == port:
                bus = free_port()
            server = RedisServer(port, extra_args=[
                "--cluster-enabled", "yes", "--cluster-port", str(bus),
                "--cluster-config-file", f"nodes-{port}.conf"])
            server.start()
            undo.callback(server.close)
            servers.append(server)
        undo.pop_all()
    return servers


def _bus_port(server: RedisServer) -> int:
    return int(server.extra_args[server.extra_args.index("--cluster-port") + 1])


def _join(servers: Sequence[RedisServer], nodes: Sequence[redis.Redis],
          ranges: Sequence[tuple[int, int]]) -> None:
    if len(servers) >= 3:
        cli = cluster_cli()
        if cli is None:
            raise BenchError("no redis-cli (or valkey-cli) to create a cluster with")
        made = subprocess.run(
            [cli, "--cluster", "create", *[f"127.0.0.1:{s.port}" for s in servers],
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=FORM_TIMEOUT, env=os.environ, check=False)
        if made.returncode != 0:
            raise BenchError(f"redis-cli --cluster create failed: {made.stdout}{made.stderr}")
        return
    # redis-cli refuses fewer than 3 masters: the same steps by hand
    for epoch, (node, (lo, hi)) in enumerate(zip(nodes, ranges, strict=True), start=1):
        _cmd(node, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        _cmd(node, "CLUSTER", "ADDSLOTSRANGE", lo, hi)
    for server in servers[1:]:
        _cmd(nodes[0], "CLUSTER", "MEET", "127.0.0.1", server.port, _bus_port(server))


@contextmanager
def local_cluster(masters: int) -> Iterator[BenchCluster]:
    """Start and join a cluster of ``masters`` masters; yield it once fully formed (see the
    module doc), or raise BenchError saying what is missing. Stops every server on exit."""
    if masters < 1:
        raise BenchError("a cluster needs at least one master")
    servers = _start(masters)
    nodes = [redis.Redis(host="127.0.0.1", port=s.port, socket_timeout=5) for s in servers]
    try:
        ranges = slot_ranges(masters)
        _join(servers, nodes, ranges)
        deadline = time.monotonic() + FORM_TIMEOUT
        while (why := _not_ready(nodes, [s.port for s in servers])) is not None:
            if time.monotonic() > deadline:
                raise BenchError(f"cluster of {masters} not formed after {FORM_TIMEOUT:g} s: "
                                 f"{why}")
            time.sleep(0.05)
        # masters in slot order (redis-cli assigns the ranges in the order given)
        owner = {port: lo for lo, _, port in _slot_map(nodes[0])}
        order = sorted(range(masters), key=lambda i: owner[servers[i].port])
        yield BenchCluster([servers[i] for i in order], [nodes[i] for i in order],
                           [(lo, hi) for lo, hi, _ in _slot_map(nodes[0])])
    finally:
        for node in nodes:
            node.close()
        for server in servers:
            server.close()
