"""A local Redis Cluster for tests, handed out only once it is fully formed.

``local_cluster(make_server, masters=3, replicas=0)`` starts ``masters * (1 + replicas)``
cluster-enabled servers from the ``make_server`` fixture, joins them with
``redis-cli --cluster create ... --cluster-replicas R`` and yields a :class:`LocalCluster`
only when

* every node says ``cluster_state:ok``, ``cluster_slots_assigned:16384`` and
  ``cluster_slots_ok:16384``, and knows every other node;
* every node's ``CLUSTER NODES`` shows the same healthy topology (no fail/pfail/handshake
  flags, every link connected, ``masters`` masters covering all 16384 slots, ``replicas``
  replicas under each) and every node's ``CLUSTER SLOTS`` agrees on the slot owners;
* with replicas: each replica has ``master_link_status:up`` and no sync in progress;
* a ``RedisCluster`` client writes and reads back a key on each master.

The servers are closed by ``make_server``; the client is closed on exit.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.cluster
import redis.exceptions

from streamwork._redis.server import RedisServer, find_server_binary, free_port
from streamwork.testing import wait_for
from tests.conftest import no_server

SLOTS = 16384
#: CLUSTER NODES flags of a node that is not (yet) a healthy member
BAD_FLAGS = frozenset({"fail", "fail?", "pfail", "handshake", "noaddr"})


def cluster_cli() -> str | None:
    """redis-cli (or the valkey-cli beside the server binary) to create a cluster with."""
    sibling = Path(find_server_binary()).with_name("valkey-cli")
    return shutil.which("redis-cli") or (str(sibling) if sibling.exists() else None)


@dataclass
class LocalCluster:
    """A formed cluster: its servers by role (as the cluster itself reports them) and a
    ``RedisCluster`` client. ``replicas_of[master_port]`` lists that master's replicas."""

    client: redis.cluster.RedisCluster
    masters: list[RedisServer]
    replicas: list[RedisServer]
    replicas_of: dict[int, list[RedisServer]] = field(default_factory=dict)

    @property
    def servers(self) -> list[RedisServer]:
        return [*self.masters, *self.replicas]

    @property
    def url(self) -> str:
        """A ``redis+cluster://`` URL for streamwork (seeded with the first master)."""
        return f"redis+cluster://127.0.0.1:{self.masters[0].port}"


def _raw(client: redis.Redis, *args: str) -> str:
    """A command's reply as text, without redis-py's reply parsing (stable across versions)."""
    reply = client.execute_command(*args)
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _info(text: str) -> dict[str, str]:
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _nodes_view(text: str) -> dict[str, tuple[str, str, frozenset[str]]]:
    """CLUSTER NODES as {address: (role, master address or "-", slot ranges)}, raising
    ValueError on a node that is not healthy from this node's point of view."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    addr_of = {parts[0]: parts[1].split("@")[0] for parts in lines}
    view: dict[str, tuple[str, str, frozenset[str]]] = {}
    for parts in lines:
        node_id, flags, master_id, link = parts[0], parts[2], parts[3], parts[7]
        flag_set = set(flags.split(","))
        if flag_set & BAD_FLAGS or link != "connected":
            raise ValueError(f"node {addr_of[node_id]} is {flags}, link {link}")
        if any(s.startswith("[") for s in parts[8:]):
            raise ValueError(f"slots migrating/importing on {addr_of[node_id]}: {parts[8:]}")
        role = "master" if "master" in flag_set else "replica" if "slave" in flag_set else flags
        master = addr_of.get(master_id, master_id) if master_id != "-" else "-"
        view[addr_of[node_id]] = (role, master, frozenset(parts[8:]))
    return view


def _slots_view(reply: Any) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """CLUSTER SLOTS (raw reply) as sorted (start, end, master port, replica ports)."""
    out = []
    for entry in reply:
        start, end, master, *replicas = entry
        out.append((int(start), int(end), int(master[1]),
                    tuple(sorted(int(r[1]) for r in replicas))))
    return sorted(out)


def _slot_count(ranges: frozenset[str]) -> int:
    total = 0
    for r in ranges:
        lo, _, hi = r.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total


def _not_ready(nodes: dict[int, redis.Redis], masters: int, replicas: int) -> str | None:
    """Why the cluster is not fully formed yet, or None when it is."""
    views: dict[int, dict[str, tuple[str, str, frozenset[str]]]] = {}
    slot_views: dict[int, list[tuple[int, int, int, tuple[int, ...]]]] = {}
    for port, node in nodes.items():
        info = _info(_raw(node, "CLUSTER", "INFO"))
        for name, want in (("cluster_state", "ok"), ("cluster_slots_assigned", str(SLOTS)),
                           ("cluster_slots_ok", str(SLOTS)),
                           ("cluster_known_nodes", str(len(nodes)))):
            if info.get(name) != want:
                return f"node {port}: {name}:{info.get(name)} (want {want})"
        try:
            views[port] = _nodes_view(_raw(node, "CLUSTER", "NODES"))
        except ValueError as unhealthy:
            return f"node {port} sees: {unhealthy}"
        slot_views[port] = _slots_view(node.execute_command("CLUSTER", "SLOTS"))
    first_port, first = next(iter(views.items()))
    for port, view in views.items():
        if view != first:
            return f"CLUSTER NODES of {port} and {first_port} disagree: {view} != {first}"
        if slot_views[port] != slot_views[first_port]:
            return (f"CLUSTER SLOTS of {port} and {first_port} disagree: "
                    f"{slot_views[port]} != {slot_views[first_port]}")
    owners = {addr: ranges for addr, (role, _, ranges) in first.items() if role == "master"}
    if len(owners) != masters or any(not ranges for ranges in owners.values()):
        return f"want {masters} masters with slots, the cluster says {first}"
    if sum(_slot_count(r) for r in owners.values()) != SLOTS:
        return f"the masters' slots do not add up to {SLOTS}: {owners}"
    covered = [(lo, hi) for lo, hi, _, _ in slot_views[first_port]]
    if covered[0][0] != 0 or covered[-1][1] != SLOTS - 1 or any(
            hi + 1 != lo for (_, hi), (lo, _) in itertools.pairwise(covered)):
        return f"CLUSTER SLOTS does not cover 0-{SLOTS - 1} contiguously: {covered}"
    for lo, hi, _, reps in slot_views[first_port]:
        if len(reps) != replicas:
            return f"slots {lo}-{hi} have replicas {reps}, want {replicas}"
    for addr in owners:
        under = [a for a, (role, m, _) in first.items() if role == "replica" and m == addr]
        if len(under) != replicas:
            return f"master {addr} has replicas {under}, want {replicas}"
    for port, node in nodes.items():
        if f"127.0.0.1:{port}" not in first:
            return f"node {port} is not in the cluster's view: {sorted(first)}"
        if first[f"127.0.0.1:{port}"][0] != "replica":
            continue
        repl = {k: str(v) for k, v in node.info("replication").items()}
        if repl.get("master_link_status") != "up" or repl.get("master_sync_in_progress") != "0":
            return (f"replica {port}: master_link_status:{repl.get('master_link_status')}, "
                    f"master_sync_in_progress:{repl.get('master_sync_in_progress')}")
    return None


def _probe(client: redis.cluster.RedisCluster, masters: list[RedisServer]) -> str | None:
    """Write and read back one key on each master through the cluster client."""
    for master in masters:
        key = next(k for i in range(100_000)
                   if client.get_node_from_key(k := f"probe:{master.port}:{i}").port
                   == master.port)
        try:
            client.set(key, "ok", ex=60)
            got = client.get(key)
            client.delete(key)
        except redis.exceptions.RedisError as e:
            return f"probe {key!r} on master {master.port}: {e!r}"
        if got != b"ok":
            return f"probe {key!r} on master {master.port} read back {got!r}"
    return None


def _start_nodes(make_server: Callable[..., RedisServer], n: int,
                 extra_args: list[str]) -> list[RedisServer]:
    servers = []
    for _ in range(n):
        port = free_port()
        bus = free_port()
        while bus == port:
            bus = free_port()
        servers.append(make_server(port=port, extra_args=[
            "--cluster-enabled", "yes", "--cluster-port", str(bus),
            "--cluster-config-file", f"nodes-{port}.conf",
            # a replica's first full sync starts at once, not after the default 5 s
            "--repl-diskless-sync-delay", "0",
            # CLUSTER SLOTS lists a replica only once its replication offset is above 0,
            # which on an idle master takes its first PING to replicas (default: 10 s)
            "--repl-ping-replica-period", "1", *extra_args]))
    return servers


@contextmanager
def local_cluster(
    make_server: Callable[..., RedisServer],
    masters: int = 3,
    replicas: int = 0,
    *,
    node_timeout_ms: int | None = None,
    extra_args: list[str] | None = None,
    timeout: float = 60.0,
) -> Iterator[LocalCluster]:
    """Start and join a cluster of ``masters`` masters with ``replicas`` replicas each;
    yield it once fully formed (see the module doc), or fail saying what is missing.
    ``node_timeout_ms`` sets ``cluster-node-timeout`` (failure detection, failover)."""
    cli = cluster_cli()
    if cli is None:
        no_server("no redis-cli/valkey-cli to create a cluster with")
    assert cli is not None
    args = list(extra_args or [])
    if node_timeout_ms is not None:
        args += ["--cluster-node-timeout", str(node_timeout_ms)]
    servers = _start_nodes(make_server, masters * (1 + replicas), args)
    made = subprocess.run(
        [cli, "--cluster", "create", *[f"127.0.0.1:{s.port}" for s in servers],
         "--cluster-replicas", str(replicas), "--cluster-yes"],
        capture_output=True, text=True, timeout=timeout, env=os.environ)
    assert made.returncode == 0, made.stdout + made.stderr
    nodes = {s.port: redis.Redis(host="127.0.0.1", port=s.port, socket_timeout=5)
             for s in servers}
    client: redis.cluster.RedisCluster | None = None
    why: str | None = "not looked at yet"

    def formed() -> tuple[list[RedisServer], dict[int, tuple[str, int]]] | None:
        """(masters, role of each port) once the cluster is fully formed, else None (and
        ``why`` says what is missing)."""
        nonlocal client, why
        try:
            why = _not_ready(nodes, masters, replicas)
            if why is not None:
                return None
            # roles as the cluster reports them (redis-cli picks the masters)
            view = _nodes_view(_raw(nodes[servers[0].port], "CLUSTER", "NODES"))
            roles = {int(a.rsplit(":", 1)[1]): (role, int(m.rsplit(":", 1)[1])
                                                if m != "-" else 0)
                     for a, (role, m, _) in view.items()}
            firsts = [s for s in servers if roles[s.port][0] == "master"]
            if client is None:
                client = redis.cluster.RedisCluster(host="127.0.0.1", port=firsts[0].port)
            why = _probe(client, firsts)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException,
                ValueError) as e:
            why = f"a node did not answer as expected: {e!r}"
        return (firsts, roles) if why is None else None

    try:
        try:
            found = wait_for(formed, timeout, 0.05, message="the cluster to form")
        except AssertionError:
            raise AssertionError(f"cluster not formed after {timeout:g}s: {why}\n"
                                 f"redis-cli said:\n{made.stdout}{made.stderr}") from None
        assert found is not None and client is not None
        primaries, role_of = found
        yield LocalCluster(
            client=client, masters=primaries,
            replicas=[s for s in servers if role_of[s.port][0] == "replica"],
            replicas_of={m.port: [s for s in servers if role_of[s.port] == ("replica", m.port)]
                         for m in primaries})
    finally:
        if client is not None:
            client.close()
        for node in nodes.values():
            node.close()


def _nodes_table(text: str) -> dict[str, tuple[frozenset[str], str, str, frozenset[str]]]:
    """CLUSTER NODES as {address: (flags, master address or "-", link, slot ranges)},
    unhealthy nodes included."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    addr_of = {parts[0]: parts[1].split("@")[0] for parts in lines}
    return {addr_of[parts[0]]: (frozenset(parts[2].split(",")),
                                addr_of.get(parts[3], parts[3]) if parts[3] != "-" else "-",
                                parts[7], frozenset(parts[8:]))
            for parts in lines}


def _not_failed_over(survivors: dict[int, redis.Redis], dead: int, promoted: int,
                     slots: frozenset[str]) -> str | None:
    """Why the cluster has not (yet) recovered from the death of master ``dead``, whose
    ``slots`` replica ``promoted`` should now serve, or None when every survivor agrees it
    has: ``promoted`` is a master, ``dead`` is flagged ``fail``, every other node is healthy
    and connected, the state is ok with all 16384 slots covered, and every survivor's
    CLUSTER SLOTS is the same and names ``promoted`` (never ``dead``) for those slots."""
    role = survivors[promoted].info("replication").get("role")
    if role != "master":
        return f"replica {promoted} is still {role}"
    dead_addr, new_addr = f"127.0.0.1:{dead}", f"127.0.0.1:{promoted}"
    slot_views = {}
    for port, node in survivors.items():
        info = _info(_raw(node, "CLUSTER", "INFO"))
        for name, want in (("cluster_state", "ok"), ("cluster_slots_assigned", str(SLOTS)),
                           ("cluster_slots_ok", str(SLOTS))):
            if info.get(name) != want:
                return f"node {port}: {name}:{info.get(name)} (want {want})"
        table = _nodes_table(_raw(node, "CLUSTER", "NODES"))
        for addr, (flags, _, link, _) in table.items():
            if addr == dead_addr:
                if "fail" not in flags:
                    return f"node {port} sees the dead master as {','.join(sorted(flags))}"
            elif flags & BAD_FLAGS or link != "connected":
                return f"node {port} sees {addr} as {','.join(sorted(flags))}, link {link}"
        new_flags, _, _, new_slots = table[new_addr]
        if "master" not in new_flags or new_slots != slots:
            return (f"node {port} sees {new_addr} as {','.join(sorted(new_flags))} with slots "
                    f"{sorted(new_slots)} (want master of {sorted(slots)})")
        slot_views[port] = _slots_view(node.execute_command("CLUSTER", "SLOTS"))
        if any(owner == dead for _, _, owner, _ in slot_views[port]):
            return f"CLUSTER SLOTS of {port} still names the dead master {dead}"
    first_port, first = next(iter(slot_views.items()))
    for port, view in slot_views.items():
        if view != first:
            return f"CLUSTER SLOTS of {port} and {first_port} disagree: {view} != {first}"
    return None


def pause(server: RedisServer) -> None:
    """SIGSTOP ``server`` (by its pid): a replica stopped so stops replicating, and every
    write its master acknowledges meanwhile exists on the master alone."""
    assert server.pid is not None, f"server {server.port} is not running"
    os.kill(server.pid, signal.SIGSTOP)


def resume(server: RedisServer) -> None:
    """SIGCONT a server `pause` stopped."""
    assert server.pid is not None, f"server {server.port} is not running"
    os.kill(server.pid, signal.SIGCONT)


def kill_master(cluster: LocalCluster, master: RedisServer, timeout: float = 30.0, *,
                then: Callable[[], None] | None = None) -> RedisServer:
    """SIGKILL ``master`` (by its pid, a crash: whatever it had not sent its replica is
    lost), call ``then`` (e.g. `resume` a replica paused to make it lag), and wait until
    its replica is promoted and every surviving node agrees the cluster is whole again
    (see `_not_failed_over`); return the promoted replica. ``cluster``'s lists are
    updated: the replica is now among its masters, with no replica of its own. Needs a
    master with exactly one replica; pass a small ``node_timeout_ms`` to `local_cluster`
    for a quick failover."""
    [replica] = cluster.replicas_of[master.port]
    dead = master.port
    survivors = {s.port: redis.Redis(host="127.0.0.1", port=s.port, socket_timeout=5)
                 for s in cluster.servers if s is not master}
    # asked of another master: the replica may be paused
    peer = next(m.port for m in cluster.masters if m is not master)
    owner = _nodes_table(_raw(survivors[peer], "CLUSTER", "NODES"))
    slots = owner[f"127.0.0.1:{dead}"][3]
    why: str | None = "not looked at yet"

    def recovered() -> bool:
        nonlocal why
        try:
            why = _not_failed_over(survivors, dead, replica.port, slots)
        except (redis.exceptions.RedisError, KeyError, ValueError) as e:
            why = f"a node did not answer as expected: {e!r}"
        return why is None

    try:
        master.kill()
        if then is not None:
            then()
        try:
            wait_for(recovered, timeout, 0.05, message="the failover")
        except AssertionError:
            raise AssertionError(f"no failover {timeout:g}s after master {dead} was killed: "
                                 f"{why}") from None
    finally:
        for node in survivors.values():
            node.close()
    cluster.masters[cluster.masters.index(master)] = replica
    cluster.replicas.remove(replica)
    del cluster.replicas_of[dead]
    cluster.replicas_of[replica.port] = []
    return replica


def kill_master_in_sync(cluster: LocalCluster, master: RedisServer, timeout: float = 30.0,
                        ) -> tuple[RedisServer, int]:
    """`kill_master` with nothing to lose: first ``CLIENT PAUSE ... WRITE`` on ``master``
    (from then on it executes no write, so it acknowledges none), then wait until its
    replica has processed the master's whole replication stream up to that point (the
    replica's ``master_repl_offset`` reaches the master's), then SIGKILL it. Every write the
    master ever acknowledged is on the replica it fails over to: with asynchronous
    replication the loss of a failover is what the replica lacks at the kill, here nothing.
    (The paused clients' commands were never executed; they fail with the connection and
    are retried on the promoted replica.) Returns the promoted replica and the offset."""
    [replica] = cluster.replicas_of[master.port]
    direct = redis.Redis(host="127.0.0.1", port=master.port, socket_timeout=10)
    follower = redis.Redis(host="127.0.0.1", port=replica.port, socket_timeout=10)
    try:
        direct.execute_command("CLIENT", "PAUSE", str(int(timeout * 1000)), "WRITE")
        try:
            # read after the pause: covers every write acknowledged before it (the PINGs the
            # master still sends its replica while paused only move the offset on)
            offset = int(direct.info("replication")["master_repl_offset"])
            wait_for(lambda: int(follower.info("replication")["master_repl_offset"])
                     >= offset, timeout, 0.01,
                     message=f"replica {replica.port} to reach offset {offset}")
        except BaseException:
            direct.execute_command("CLIENT", "UNPAUSE")  # no kill after all: let it serve
            raise
    finally:
        direct.close()
        follower.close()
    return kill_master(cluster, master, timeout), offset


def rejoin(cluster: LocalCluster, server: RedisServer, master: RedisServer,
           timeout: float = 60.0) -> None:
    """Start ``server`` again, a master `kill_master` killed and ``master`` replaced: from its
    cluster config file it rejoins, learns its slots moved on, and becomes ``master``'s
    replica (empty, it syncs in full). Wait until the cluster is whole again as
    `local_cluster` hands one out (every node agrees, each master has its replica, links
    up, no sync in progress); ``cluster``'s lists then name ``server`` as that replica."""
    server.start()
    servers = [*cluster.servers, server]
    nodes = {s.port: redis.Redis(host="127.0.0.1", port=s.port, socket_timeout=5)
             for s in servers}
    why: str | None = "not looked at yet"

    def whole() -> bool:
        nonlocal why
        try:
            why = _not_ready(nodes, len(cluster.masters), 1)
            if why is None:
                repl = nodes[server.port].info("replication")
                if repl.get("role") != "slave" or str(repl.get("master_port")) != str(
                        master.port):
                    why = f"{server.port} is {repl.get('role')} of {repl.get('master_port')}"
        except (redis.exceptions.RedisError, ValueError) as e:
            why = f"a node did not answer as expected: {e!r}"
        return why is None

    try:
        try:
            wait_for(whole, timeout, 0.05, message="the old master to rejoin")
        except AssertionError:
            raise AssertionError(f"{server.port} did not rejoin as the replica of "
                                 f"{master.port} in {timeout:g}s: {why}") from None
    finally:
        for node in nodes.values():
            node.close()
    cluster.replicas.append(server)
    cluster.replicas_of[master.port] = [server]
