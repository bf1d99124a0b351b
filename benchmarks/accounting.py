"""Redis commands per job (INFO commandstats, MONITOR) and Redis memory per done-marker."""

from __future__ import annotations

import socket
import statistics
import threading
from collections import Counter
from typing import Any, Final

import redis

from streamwork._wire.keys import StreamKeys
from streamwork.errors import BenchError

#: commands the harness itself sends while it watches a worker (not counted)
OWN_COMMANDS: Final = frozenset({"info", "echo", "config|resetstat", "monitor", "client|info"})
#: client commands that are a round trip of the consume hot path
ROUND_TRIPS: Final = ("evalsha", "eval", "xreadgroup", "xautoclaim", "xack")


class Monitor(threading.Thread):
    """Counts commands by name through MONITOR, split into client-sent and run by Lua.

    Runs until it sees ``ECHO <marker>``; lines from ``skip_addr`` (the harness's own
    connection) are ignored."""

    def __init__(self, port: int, marker: str, skip_addr: str) -> None:
        super().__init__(name="bench-monitor", daemon=True)
        self.client: Counter[str] = Counter()
        self.lua: Counter[str] = Counter()
        self._marker = marker.encode()
        self._skip = skip_addr.encode()
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self._sock.sendall(b"MONITOR\r\n")
        reply = self._sock.recv(5)
        if not reply.startswith(b"+OK"):
            raise BenchError(f"MONITOR refused: {reply!r}")

    def run(self) -> None:
        buf = b""
        try:
            while True:
                chunk = self._sock.recv(1 << 20)
                if not chunk:
                    return
                *lines, buf = (buf + chunk).split(b"\r\n")
                for line in lines:
                    if self._count(line):
                        return
        finally:
            self._sock.close()

    def _count(self, line: bytes) -> bool:
        opened, closed = line.find(b"["), line.find(b'] "')
        if opened < 0 or closed < 0:
            return False
        source = line[opened + 1 : closed].split(b" ")[-1]
        end = line.find(b'"', closed + 3)
        name = line[closed + 3 : end].decode(errors="replace").lower()
        if source == b"lua":
            self.lua[name] += 1
        elif source == self._skip:
            return name == "echo" and self._marker in line
        else:
            self.client[name] += 1
        return False


def commands_per_job(extra: dict[str, Any], jobs: int) -> dict[str, Any]:
    """Commands per job of one accounting run, from commandstats and MONITOR."""
    stats = {k: v for k, v in extra["commandstats"].items() if k not in OWN_COMMANDS}
    client = {k: v for k, v in extra.get("client", {}).items() if k not in OWN_COMMANDS}
    total = sum(stats.values())
    trips = sum(client.get(name, 0) for name in ROUND_TRIPS)
    return {
        "jobs": jobs,
        "total_per_job": round(total / jobs, 3),
        "round_trips_per_job": round(trips / jobs, 4),
        "client_commands_per_job": round(sum(client.values()) / jobs, 4),
        "inside_scripts_per_job": round(sum(extra.get("lua", {}).values()) / jobs, 3),
        "by_command": dict(sorted(stats.items(), key=lambda kv: -kv[1])),
        "client_by_command": dict(sorted(client.items(), key=lambda kv: -kv[1])),
    }


def done_marker_memory(r: redis.Redis, extra: dict[str, Any], jobs: int) -> dict[str, Any]:
    """MEMORY USAGE of sampled done-markers, and the used_memory growth per 10k markers."""
    prefix = StreamKeys.for_stream(extra["stream"]).group(extra["group"]).job_prefix
    sample: list[bytes] = []
    for key in r.scan_iter(match=prefix + "*", count=1000):
        sample.append(key)
        if len(sample) >= 200:
            break
    sizes = [int(r.memory_usage(k, samples=0) or 0) for k in sample]
    markers = int(r.eval("return #redis.call('KEYS', ARGV[1])", 0, prefix + "*"))
    value = r.get(sample[0]) if sample else b""
    return {
        "markers": markers,
        "memory_usage_bytes": round(statistics.mean(sizes), 1) if sizes else 0.0,
        "sampled": len(sizes),
        "key_bytes": len(sample[0]) if sample else 0,
        "value_bytes": len(value or b""),
        "used_memory_per_10k": round(extra["used_memory_delta"] / max(markers, 1) * 10_000),
        "used_memory_bytes_per_marker": round(extra["used_memory_delta"] / max(markers, 1), 1),
        "note": f"{jobs} jobs; the used_memory delta also holds the group's consumer entry "
                "and the fencing counter",
    }
