"""The billing demo (`make demo`, `streamwork demo`): retries, dead letters, once-only effect.

A producer enqueues orders (some twice, as a retrying web client would); three workers
charge them. A few card networks time out once (retried with backoff), a few cards are
declined for good (dead-lettered). At the end every order was charged exactly once or
dead-lettered, as the job status API (`producer.status`) confirms.

Run: python examples/demo.py [REDIS_URL] [--orders N]

REDIS_URL defaults to $REDIS_URL, else redis://127.0.0.1:6379/0. When a server answers
there the demo uses it and touches only its own keys: a stream named
demo-orders-<random hex> and the keys streamwork keeps for it ({demo-orders-<hex>}:*),
deleted at the end. When none answers it starts a private redis-server (or the Valkey
binary of the 'embedded' extra) on a free loopback port and stops it at the end. The
first line it prints says which of the two happened.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import streamwork as sw
from streamwork.testing import RedisServer

DEFAULT_URL = "redis://127.0.0.1:6379/0"

ledger: Counter[str] = Counter()  # order -> how often its card was charged
declined_seen: set[str] = set()  # orders whose card was declined
flaky: set[str] = set()  # orders whose first charge times out at the card network


class Billing(sw.StreamWorker):
    """Charges one order per job (its stream is given to ``from_url``)."""

    group = "billing"
    concurrency = 32
    retry_delay = 0.2
    retry_max_delay = 2.0
    visibility_timeout = 10.0
    read_block = 0.2

    async def handle(self, msg: sw.Message) -> None:
        order = msg.payload
        await asyncio.sleep(random.uniform(0.001, 0.004))  # the card network's latency
        if order["declined"]:
            declined_seen.add(msg.key)
            raise sw.DeadLetter(f"card ending {order['card']} declined permanently")
        if msg.key in flaky and msg.attempt == 1:
            raise TimeoutError("card network timed out")  # any exception: retried later
        ledger[msg.key] += 1


@dataclass
class DemoResult:
    """The figures of the summary table."""

    orders: int
    sent: int
    charged: int
    double_charged: int
    retried: int
    dead_lettered: int
    deduplicated: int
    pending: int
    seconds: float

    @property
    def ok(self) -> bool:
        settled = self.charged + self.dead_lettered == self.orders
        return settled and self.double_charged == 0 and self.pending == 0


def shown(url: str) -> str:
    """``url`` with its password masked, fit to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{parts.netloc.rsplit('@', 1)[1]}"))


def why_unusable(url: str) -> str | None:
    """None if a server answers PING at ``url``, else what went wrong."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        with client:
            client.ping()
        return None
    except (redis.RedisError, OSError) as exc:
        return str(exc) or type(exc).__name__


def run_demo(url: str | None = None, orders: int = 2000,
             console: Console | None = None) -> DemoResult:
    """Bill ``orders`` orders on the server at ``url`` if one answers there, else on a
    private one; print the summary and return its figures."""
    console = console or Console()
    url = url or os.environ.get("REDIS_URL") or DEFAULT_URL
    stream = f"demo-orders-{secrets.token_hex(4)}"  # a fresh name: no one else's keys
    own_keys = f"{stream}, {{{stream}}}:*"
    problem = why_unusable(url)
    try:
        server = None if problem is None else RedisServer()  # a private one, not started yet
    except sw.StreamworkError as exc:  # no redis-server on PATH, no 'embedded' extra
        raise sw.StreamworkError(f"Nothing usable answered at {shown(url)} ({problem}) and "
                                 f"the demo cannot start a server of its own: {exc}") from None
    try:
        if server is None:
            say(console, f"Using Redis at {shown(url)} (already running; not started by the "
                         f"demo). The demo touches only its own keys ({own_keys}) and deletes "
                         "them at the end.")
        else:
            server.start()
            say(console, f"Using Redis at {server.url} (a private {Path(server.binary).name} "
                         f"the demo started: {server.binary}; it stops it at the end). The "
                         f"demo touches only its own keys ({own_keys}).")
            say(console, f"Nothing usable answered at {shown(url)} ({problem}); set REDIS_URL "
                         "or pass a URL to use a server of your own.")
        result = asyncio.run(bill(server.url if server else url, stream, orders, console))
    finally:
        if server is not None:
            server.close()
    print_summary(console, result)
    return result


def say(console: Console, text: str) -> None:
    """Print ``text`` as one line (no wrapping, no markup)."""
    console.print(text, soft_wrap=True, markup=False, highlight=False)


async def bill(url: str, stream: str, orders: int, console: Console) -> DemoResult:
    """Send the orders, charge them with three workers, wait until each one is settled,
    then delete the demo's keys."""
    rng = random.Random(7)
    keys = [f"order-{i}" for i in range(orders)]
    declined = set(rng.sample(keys, max(1, orders // 200)))
    ledger.clear()
    declined_seen.clear()
    flaky.clear()
    flaky.update(set(rng.sample(keys, max(1, orders // 20))) - declined)
    resent = rng.sample(keys, orders // 10)
    payloads = [{"order_id": k, "amount_cents": rng.randrange(100, 50_000),
                 "card": f"{rng.randrange(10_000):04d}", "declined": k in declined} for k in keys]
    by_key = dict(zip(keys, payloads, strict=True))
    workers = [Billing.from_url(url, stream=stream) for _ in range(3)]
    r = aioredis.Redis.from_url(url)
    try:
        tasks = [asyncio.create_task(w.serve()) for w in workers]
        try:
            start = time.perf_counter()
            async with sw.AsyncProducer.from_url(url) as producer:
                for i in range(0, orders, 500):
                    await producer.send_many(stream, payloads[i:i + 500], keys=keys[i:i + 500])
                await producer.send_many(stream, [by_key[k] for k in resent], keys=resent)
                await charge_all(r, stream, len(keys), console)
                elapsed = time.perf_counter() - start
                states = await final_states(producer, stream, keys)
        finally:
            for w in workers:
                w.stop()
            await asyncio.gather(*tasks)
    finally:
        await delete_own_keys(r, stream)
        await r.aclose()
    total: Counter[str] = Counter()
    for w in workers:
        total.update(w.counts)
    return DemoResult(
        orders=orders, sent=orders + len(resent), charged=len(ledger),
        double_charged=sum(1 for n in ledger.values() if n > 1),
        retried=total["retried"], dead_lettered=Counter(states.values())["dead"],
        deduplicated=total["deduplicated"],
        pending=sum(1 for s in states.values() if s not in ("done", "dead")), seconds=elapsed,
    )


async def charge_all(r: aioredis.Redis, stream: str, orders: int, console: Console,
                     timeout: float = 120.0) -> None:
    """Show a progress bar until every order was charged or declined and the group has
    read and acknowledged every entry of the stream (the resent duplicates too)."""
    with Progress(TextColumn("[bold]charging orders"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        bar = progress.add_task("orders", total=orders)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            handled = len(ledger) + len(declined_seen)
            progress.update(bar, completed=min(handled, orders))
            if handled >= orders and await all_read(r, stream):
                return
            await asyncio.sleep(0.05)


async def final_states(producer: sw.AsyncProducer, stream: str, keys: list[str],
                       timeout: float = 30.0) -> dict[str, str]:
    """Each order's state by its job status, once all are done or dead (or at the
    timeout): a retried order's last outcome may land a moment after its handler ran."""
    states = dict.fromkeys(keys, "unknown")
    open_keys = list(keys)
    deadline = time.monotonic() + timeout
    while open_keys and time.monotonic() < deadline:
        for i in range(0, len(open_keys), 50):  # 50 status reads at a time
            found = await asyncio.gather(*(producer.status(stream, k, group=Billing.group)
                                           for k in open_keys[i:i + 50]))
            states.update((st.key, st.state) for st in found)
        open_keys = [k for k in open_keys if states[k] not in ("done", "dead")]
        if open_keys:
            await asyncio.sleep(0.05)
    return states


async def all_read(r: aioredis.Redis, stream: str) -> bool:
    """Whether the group has been handed every entry of the stream and acknowledged it."""
    last_id = (await r.xinfo_stream(stream))["last-generated-id"]
    for group in await r.xinfo_groups(stream):
        if group["name"] == Billing.group.encode():
            return bool(group["last-delivered-id"] == last_id and group["pending"] == 0)
    return False


async def delete_own_keys(r: aioredis.Redis, stream: str) -> None:
    """Delete the demo's stream and the keys streamwork keeps for it (``{stream}:...``),
    nothing else: the server may hold other people's data."""
    doomed = [k async for k in r.scan_iter(match=f"{{{stream}}}:*", count=1000)]
    await r.delete(stream, *doomed)


def print_summary(console: Console, result: DemoResult) -> None:
    table = Table(title="streamwork demo: billing")
    table.add_column("what")
    table.add_column("value", justify="right")
    for name, value in [
        ("orders", result.orders),
        ("jobs sent (incl. resends of the same order)", result.sent),
        ("orders charged", result.charged),
        ("orders charged twice", result.double_charged),
        ("duplicates suppressed", result.deduplicated),
        ("retries (card network timeouts)", result.retried),
        ("orders dead-lettered (declined cards)", result.dead_lettered),
        ("left pending", result.pending),
        ("elapsed", f"{result.seconds:.2f} s"),
        ("throughput", f"{result.sent / result.seconds:,.0f} jobs/s"),
    ]:
        table.add_row(name, str(value))
    console.print(table)
    console.print("[green]OK: every order charged once or dead-lettered" if result.ok else
                  "[red]FAILED: an order was lost or charged twice")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("url", nargs="?", help=f"default: $REDIS_URL, else {DEFAULT_URL}")
    parser.add_argument("--orders", type=int, default=2000, help="how many orders to bill")
    args = parser.parse_args()
    try:
        raise SystemExit(0 if run_demo(args.url, args.orders).ok else 1)
    except sw.StreamworkError as exc:
        raise SystemExit(str(exc)) from None
