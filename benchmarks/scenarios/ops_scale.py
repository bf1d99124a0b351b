"""The operator's tools at scale: the dashboard page and ``streamwork inspect`` over N streams.

    python -m benchmarks.scenarios.ops_scale [--streams 100,2000] [--url URL] [--json]

On a private redis-server (or ``--url``, a loopback server it may FLUSHALL), for each N:
N streams ``ops-00000`` ... are left as real workers leave them: 10 jobs each sent by the
:class:`~streamwork.Producer`, a consumer group ``work`` that read 3 of them and holds them
(pending, 4 consumers over the streams) and leaves 7 unread (lag); every 20th stream also
has 2 dead letters, written by a real :class:`~streamwork.StreamWorker` whose handler gives
up on them (with its group's retry stream, consumers and job records). Then it measures:

* ``page cold`` / ``page warm``: ``GET /`` of ``streamwork dashboard`` (a subprocess on a
  loopback port; the page is server-rendered and loads nothing else): the first request
  after the server listens (as when an operator starts it and opens the page: whatever
  the dashboard does at start-up, such as a first rate sample, runs beside it), then the
  next one;
* ``sample``: one sample of the dashboard's rate sampler (``data.snapshot``, in-process);
* ``inspect fn``: the function behind ``streamwork inspect`` (``sample_view`` of every
  stream, in-process, no rendering);
* ``inspect cli`` / ``inspect --json``: ``python -m streamwork inspect`` as a subprocess
  (interpreter start included).

For each: wall seconds, CPU seconds of the client (this process, the CLI's or the
dashboard's; they hardly depend on the machine's other load, wall seconds do) and of
redis-server (INFO cpu), Redis commands (``CONFIG RESETSTAT`` before, ``INFO commandstats``
after; the cold page's count includes a rate sample taken beside it, if any, the warm
page's cannot: the sampler runs once an hour here), and the longest command in
``SLOWLOG`` (threshold 1 ms, ``SLOWLOG RESET`` before; 0 when none took 1 ms). Processes
are ended by their pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import redis

import streamwork as sw
from benchmarks.run import private_server
from streamwork._cli.views import View, sample_view
from streamwork._dashboard import data
from streamwork._redis import connection
from streamwork.testing import free_port, run_until_idle

ROOT: Final = Path(__file__).resolve().parents[2]
GROUP: Final = "work"
JOBS: Final = 10  #: jobs sent to each stream
HELD: Final = 3  #: of which read and held (pending) by the group
DEAD_EVERY: Final = 20  #: every this many streams has dead letters
DEAD: Final = 2  #: dead letters of such a stream
SLOW_US: Final = 1000  #: SLOWLOG threshold (µs)
DEFAULT_COUNTS: Final = (100, 2000)


class GiveUp(sw.StreamWorker):
    """Dead-letters every job it gets (the stream is set per instance)."""

    group = GROUP
    max_deliveries = 1
    read_block = 0.05

    async def handle(self, msg: sw.Message) -> None:
        raise sw.DeadLetter("cannot bill this order")


def stream_name(i: int) -> str:
    return f"ops-{i:05d}"


def seed(url: str, r: redis.Redis, n: int) -> None:
    """N streams left as workers leave them (see the module's docstring); untimed."""
    dead = [stream_name(i) for i in range(0, n, DEAD_EVERY)]
    with sw.Producer.from_url(url) as producer:
        for name in dead:
            producer.send_many(name, [{"poison": j} for j in range(DEAD)])

    async def give_up(names: list[str]) -> None:
        await asyncio.gather(*(run_until_idle(GiveUp.from_url(url, stream=name), r, 60)
                               for name in names))

    for i in range(0, len(dead), 25):
        asyncio.run(give_up(dead[i:i + 25]))
    with sw.Producer.from_url(url) as producer:
        for i in range(n):
            producer.send_many(stream_name(i), [{"order": j, "cents": 1999}
                                                for j in range(JOBS)])
    for lo in range(0, n, 500):
        names = [stream_name(i) for i in range(lo, min(lo + 500, n))]
        pipe = r.pipeline(transaction=False)
        for name in names:
            pipe.xgroup_create(name, GROUP, id="0")
        pipe.execute(raise_on_error=False)  # BUSYGROUP where a worker made it already
        pipe = r.pipeline(transaction=False)
        for k, name in enumerate(names):
            pipe.xreadgroup(GROUP, f"worker-{k % 4}", {name: ">"}, count=HELD)
        pipe.execute()


def commandstats(r: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT (without the reading itself)."""
    calls = {name.removeprefix("cmdstat_"): int(v["calls"])
             for name, v in r.info("commandstats").items()}
    calls.pop("info", None)
    return calls


def slowest_ms(r: redis.Redis) -> tuple[float, str]:
    """The longest command logged since SLOWLOG RESET (ms) and its name; (0, "") if none."""
    entries = r.slowlog_get(128)
    if not entries:
        return 0.0, ""
    top = max(entries, key=lambda e: int(e["duration"]))
    command = top.get("command", b"")
    name = (command.decode() if isinstance(command, bytes) else str(command)).split(" ")[0]
    return int(top["duration"]) / 1000, name


def redis_cpu_s(r: redis.Redis) -> float:
    cpu = r.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def client_cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process and its waited-for children, or of the
    process ``pid`` (from /proc)."""
    if pid is None:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
            resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def counted(r: redis.Redis, into: dict[str, Any], pid: Callable[[], int | None] = lambda: None,
            ) -> Iterator[None]:
    """Time the block (wall, and CPU of this process and its children or of the process
    ``pid()``, and of redis-server) and count its Redis commands and its slowest command
    into ``into``. CPU seconds hardly depend on what else runs on the machine; wall
    seconds do."""
    r.config_set("slowlog-log-slower-than", SLOW_US)
    r.slowlog_reset()
    r.config_resetstat()
    cpu, server_cpu = client_cpu_s(pid()), redis_cpu_s(r)
    started = time.perf_counter()
    yield
    into["s"] = round(time.perf_counter() - started, 3)
    into["cpu_s"] = round(client_cpu_s(pid()) - cpu, 3)
    into["redis_cpu_s"] = round(redis_cpu_s(r) - server_cpu, 3)
    calls = commandstats(r)
    calls.pop("config", None)
    into["commands"] = sum(calls.values())
    into["slowlog_max_ms"], into["slowest"] = slowest_ms(r)
    into["top_commands"] = dict(sorted(calls.items(), key=lambda kv: -kv[1])[:4])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET {url}: {resp.status}")
        return len(body)


def _quiet(r: redis.Redis) -> None:
    """Wait until a rate sample taken at start-up, if any, is over (no command counted for
    0.3 s)."""
    last, deadline = -1, time.monotonic() + 120
    while time.monotonic() < deadline:
        now = sum(commandstats(r).values())
        if now == last:
            return
        last = now
        time.sleep(0.3)


def measure_page(url: str, r: redis.Redis) -> dict[str, Any]:
    """Cold and warm ``GET /`` of ``streamwork dashboard`` serving ``url``."""
    port = free_port()
    out: dict[str, Any] = {"cold": {}, "warm": {}}
    with counted(r, out["cold"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamwork", "dashboard", "--port", str(port), "--url", url,
             "--refresh", "0", "--sample-interval", "3600", "--window", "120"],
            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not _listening(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the dashboard did not start: {proc.stderr!r}")
                time.sleep(0.02)
            started, cpu = time.perf_counter(), client_cpu_s(proc.pid)
            out["bytes"] = _get(f"http://127.0.0.1:{port}/")
            out["cold"]["page_s"] = round(time.perf_counter() - started, 3)
            out["cold"]["page_cpu_s"] = round(client_cpu_s(proc.pid) - cpu, 3)
            _quiet(r)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    try:
        with counted(r, out["warm"], lambda: proc.pid):
            _get(f"http://127.0.0.1:{port}/")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # the GET, not the server's start-up (its CPU: a rate sample's beside it as well)
    out["cold"]["s"] = out["cold"].pop("page_s")
    out["cold"]["cpu_s"] = out["cold"].pop("page_cpu_s")
    return out


def measure_cli(url: str, r: redis.Redis, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with counted(r, out):
        done = subprocess.run([sys.executable, "-m", "streamwork", "inspect", "--url", url,
                               *args], env=_env(), capture_output=True, timeout=600,
                              check=False)
    if done.returncode != 0:
        raise RuntimeError(f"streamwork inspect {args}: {done.stderr.decode()[-500:]}")
    out["bytes"] = len(done.stdout)
    return out


def measure_fn(r: redis.Redis, fn: Callable[[], list[Any]], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with counted(r, out):
        found = fn()
    if len(found) != n:
        raise RuntimeError(f"{len(found)} streams seen, {n} expected")
    return out


def measure(url: str, r: redis.Redis, n: int) -> dict[str, Any]:
    client = connection.sync_client(url)
    try:
        page = measure_page(url, r)
        result = {
            "page_cold": page["cold"], "page_warm": page["warm"],
            "sample": measure_fn(r, lambda: data.snapshot(client), n),
            "inspect_fn": measure_fn(r, lambda: sample_view(client, View(None)), n),
            "inspect_cli": measure_cli(url, r),
            "inspect_json": measure_cli(url, r, "--json"),
        }
        result["page_warm"]["bytes"] = page["bytes"]
        return result
    finally:
        client.close()


def run(stream_counts: list[int], url: str | None = None) -> dict[str, Any]:
    """Seed and measure each count in turn; ``{"results": {N: {what: figures}}, ...}``."""
    results: dict[str, Any] = {}
    with private_server(url) as (server_url, _port):
        r = redis.Redis.from_url(server_url)
        try:
            version = str(r.info("server")["redis_version"])
            for n in stream_counts:
                r.flushall()
                seed(server_url, r, n)
                results[str(n)] = measure(server_url, r, n)
        finally:
            r.close()
    return {"results": results, "redis": version, "cpus": os.cpu_count(),
            "load": os.getloadavg(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


ROWS: Final = (("page_cold", "dashboard GET / (cold)"), ("page_warm", "dashboard GET / (warm)"),
               ("sample", "dashboard rate sample"), ("inspect_fn", "inspect (function)"),
               ("inspect_cli", "streamwork inspect"), ("inspect_json", "streamwork inspect --json"))


def table(result: dict[str, Any]) -> str:
    """The result as a Markdown table."""
    lines = ["| streams | what | wall s | client CPU s | Redis CPU s | Redis commands "
             "| SLOWLOG max (ms) |", "|---:|---|---:|---:|---:|---:|---:|"]
    for n, figures in result["results"].items():
        for key, label in ROWS:
            f = figures[key]
            slow = f"{f['slowlog_max_ms']:.1f} ({f['slowest']})" if f["slowest"] else "0"
            lines.append(f"| {int(n):,} | {label} | {f['s']:.3f} | {f['cpu_s']:.3f} | "
                         f"{f['redis_cpu_s']:.3f} | {f['commands']:,} | {slow} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.ops_scale")
    ap.add_argument("--streams", default=",".join(map(str, DEFAULT_COUNTS)),
                    help="stream counts to measure, comma-separated")
    ap.add_argument("--url", default=None,
                    help="a loopback Redis it may FLUSHALL (default: a private redis-server)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON too")
    args = ap.parse_args()
    result = run([int(x) for x in args.streams.split(",") if x.strip()], args.url)
    print(table(result))
    load = ", ".join(f"{x:.2f}" for x in result["load"])
    print(f"\n{result['when']}, {result['cpus']} CPUs, Redis {result['redis']}, load {load}")
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
