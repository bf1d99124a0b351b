"""A local Redis Sentinel deployment for tests: a primary, two replicas (``--replicaof``)
and three sentinels (``redis-server sentinel.conf --sentinel``) monitoring service ``svc``
with quorum 2, all on free loopback ports; every process is ended by its pid."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from streamwork._redis.server import RedisServer, find_server_binary, free_port
from streamwork.testing import wait_for

SERVICE = "svc"
DOWN_AFTER_MS = 1000  #: a primary silent this long is subjectively down
FAILOVER_TIMEOUT_MS = 5000


@dataclass
class Sentinel:
    """One sentinel process and its config file (which it rewrites)."""

    port: int
    directory: Path
    password: str | None = None  #: the sentinel's requirepass
    proc: subprocess.Popen[bytes] | None = None

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5,
                           password=self.password, decode_responses=True)

    def log(self) -> str:
        path = self.directory / "sentinel.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else "(no log)"

    def end(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class LocalSentinels:
    """The deployment: ``url`` is its sentinel URL; ``servers`` the data nodes by port."""

    primary: RedisServer
    replicas: list[RedisServer]
    sentinels: list[Sentinel] = field(default_factory=list)
    password: str | None = None  #: the data nodes' requirepass

    @property
    def url(self) -> str:
        """The sentinel URL, with the passwords when the deployment has them."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        auth = f":{self.password}@" if self.password else ""
        spw = self.sentinels[0].password if self.sentinels else None
        query = f"?sentinel_password={spw}" if spw else ""
        return f"redis+sentinel://{auth}{hosts}/{SERVICE}{query}"

    def direct(self, port: int) -> redis.Redis:
        """A plain client of the data node on ``port``."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10,
                           password=self.password)

    @property
    def servers(self) -> dict[int, RedisServer]:
        return {s.port: s for s in [self.primary, *self.replicas]}

    def settled_primary(self, not_port: int) -> int | None:
        """The new primary once the failover away from ``not_port`` has settled: every
        sentinel names the same node and that node says it is a master (a sentinel may
        name a replica promoted in a failover that a later one, in a newer epoch, undoes
        on a busy machine); else None."""
        ports = set()
        for s in self.sentinels:
            try:
                with s.client() as c:
                    _, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
            except redis.RedisError:
                return None
            ports.add(int(port))
        if len(ports) != 1 or not_port in ports:
            return None
        port = ports.pop()
        try:
            with self.direct(port) as c:
                role = c.info("replication")["role"]
        except redis.RedisError:
            return None
        return port if role == "master" else None

    def logs(self) -> str:
        return "\n".join(f"--- sentinel {s.port}:\n{s.log()}" for s in self.sentinels)


def _sentinel_conf(port: int, primary: int, directory: Path, password: str | None,
                   sentinel_password: str | None) -> str:
    auth = f"sentinel auth-pass {SERVICE} {password}\n" if password else ""
    auth += f"requirepass {sentinel_password}\n" if sentinel_password else ""
    return (f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {directory}\n{auth}"
            f"logfile {directory / 'sentinel.log'}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 2\n")


def _not_ready(deployment: LocalSentinels) -> str | None:
    """What the sentinels do not see yet (each other, both replicas), or None."""
    for s in deployment.sentinels:
        try:
            with s.client() as c:
                info = c.execute_command("SENTINEL", "MASTER", SERVICE)
        except redis.RedisError as exc:
            return f"sentinel {s.port}: {exc}"
        fields = info if isinstance(info, dict) else dict(zip(info[::2], info[1::2], strict=True))
        if int(fields["num-other-sentinels"]) < 2 or int(fields["num-slaves"]) < 2:
            return f"sentinel {s.port} sees {fields['num-other-sentinels']} sentinels, " \
                   f"{fields['num-slaves']} replicas"
        if fields["flags"] != "master":
            return f"sentinel {s.port}: flags {fields['flags']}"
    return None


def _replicas_linked(deployment: LocalSentinels) -> bool:
    with deployment.direct(deployment.primary.port) as c:
        info = c.info("replication")
    return int(info.get("connected_slaves", 0)) == 2 and all(
        info[f"slave{i}"]["state"] == "online" for i in range(2))


@contextmanager
def local_sentinels(server_args: list[str] | None = None, timeout: float = 45.0, *,
                    password: str | None = None,
                    sentinel_password: str | None = None) -> Iterator[LocalSentinels]:
    """Start the deployment, wait until the sentinels see each other and both replicas,
    yield it; end every process by its pid afterwards. ``server_args``: extra arguments of
    the three data nodes (e.g. ``--min-replicas-to-write 1``); ``password``: their
    requirepass (set once each answers PING); ``sentinel_password``: the sentinels'."""
    extra = list(server_args or []) + (["--masterauth", password] if password else [])
    made: list[RedisServer] = []
    deployment: LocalSentinels | None = None
    root = Path(tempfile.mkdtemp(prefix="streamwork-sentinels-"))
    try:
        primary = RedisServer(extra_args=extra).start()
        made.append(primary)
        for _ in range(2):
            made.append(RedisServer(extra_args=[*extra, "--replicaof", "127.0.0.1",
                                                str(primary.port)]).start())
        if password:
            for server in made:
                with redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5) as c:
                    c.config_set("requirepass", password)
        deployment = LocalSentinels(primary, made[1:], password=password)
        wait_for(lambda: _replicas_linked(deployment), timeout, 0.05,
                 message="replicas online")
        binary = find_server_binary()
        for i in range(3):
            port = free_port()
            directory = root / f"sentinel{i}"
            directory.mkdir()
            conf = directory / "sentinel.conf"
            conf.write_text(_sentinel_conf(port, primary.port, directory, password,
                                           sentinel_password))
            sentinel = Sentinel(port, directory, sentinel_password)
            sentinel.proc = subprocess.Popen([binary, str(conf), "--sentinel"],
                                             stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL)
            deployment.sentinels.append(sentinel)
        seen: list[str | None] = [None]

        def ready() -> bool:
            seen[0] = _not_ready(deployment)  # type: ignore[arg-type]
            return seen[0] is None
        try:
            wait_for(ready, timeout, 0.1, message="the sentinels to see each other and the "
                                                  "replicas")
        except AssertionError as late:
            raise AssertionError(f"{late}: {seen[0]}\n{deployment.logs()}") from None
        yield deployment
    finally:
        if deployment is not None:
            for s in deployment.sentinels:
                s.end()
        for server in made:
            server.close()
