"""``streamwork demo``: a billing run that shows retries, dead letters and once-only effect.

A producer enqueues orders (some twice, as a retrying web client would); three workers
charge them. A few card networks time out once (retried with backoff), a few cards are
declined for good (dead-lettered). At the end every order was charged exactly once.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass

import redis
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ._codec import decode_body
from ._keys import StreamKeys
from ._message import Message
from ._producer import AsyncProducer
from ._server import RedisServer
from ._worker import StreamWorker
from .errors import DeadLetter


@dataclass
class DemoResult:
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


class Billing(StreamWorker):
    """Charges one order per job; the ledger records every charge it makes."""

    group = "billing"
    concurrency = 32
    retry_delay = 0.2
    retry_max_delay = 2.0
    visibility_timeout = 10.0
    read_block = 0.2
    ledger: Counter[str] = Counter()
    flaky: set[str] = set()

    async def handle(self, msg: Message) -> None:
        order = msg.payload
        await asyncio.sleep(random.uniform(0.001, 0.004))  # the card network's latency
        if order["declined"]:
            raise DeadLetter(f"card ending {order['card']} declined permanently")
        if msg.key in self.flaky and msg.attempt == 1:
            raise TimeoutError("card network timed out")
        self.ledger[msg.key] += 1


def _reachable(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        with client:
            return bool(client.ping())
    except (redis.exceptions.RedisError, OSError):
        return False


async def _run(url: str, orders: int, console: Console) -> DemoResult:
    stream = f"demo-orders-{random.randrange(16**6):06x}"
    rng = random.Random(7)
    keys = [f"order-{i}" for i in range(orders)]
    declined = set(rng.sample(keys, max(1, orders // 200)))
    Billing.ledger = Counter()
    Billing.flaky = set(rng.sample(keys, max(1, orders // 20))) - declined
    resent = rng.sample(keys, orders // 10)
    payloads = [{"order_id": k, "amount_cents": rng.randrange(100, 50_000),
                 "card": f"{rng.randrange(10_000):04d}", "declined": k in declined} for k in keys]
    by_key = dict(zip(keys, payloads, strict=True))
    workers = [Billing.from_url(url, stream=stream) for _ in range(3)]
    tasks = [asyncio.create_task(w.serve()) for w in workers]
    start = time.perf_counter()
    async with AsyncProducer.from_url(url) as producer:
        for i in range(0, orders, 500):
            await producer.send_many(stream, payloads[i:i + 500], keys=keys[i:i + 500])
        await producer.send_many(stream, [by_key[k] for k in resent], keys=resent)
        sent = orders + len(resent)
        with Progress(TextColumn("[bold]charging orders"), BarColumn(),
                      TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                      console=console, transient=True) as progress:
            bar = progress.add_task("orders", total=orders)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                settled = len(Billing.ledger) + len(declined)
                progress.update(bar, completed=min(settled, orders))
                if settled >= orders and not await _pending(producer, stream):
                    break
                await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - start
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks)
        client = producer._redis
        pending = (await client.xpending(stream, Billing.group))["pending"]
        sk = StreamKeys.for_stream(stream)
        dead_orders = {decode_body(values[b"f.d"]).key
                       for _, values in await client.xrange(sk.dead)}
        doomed = [k async for k in client.scan_iter(match=sk.prefix + ":*", count=1000)]
        await client.delete(stream, *doomed)
    total: Counter[str] = Counter()
    for w in workers:
        total.update(w.counts)
    return DemoResult(
        orders=orders, sent=sent, charged=len(Billing.ledger),
        double_charged=sum(1 for n in Billing.ledger.values() if n > 1),
        retried=total["retried"], dead_lettered=len(dead_orders),
        deduplicated=total["deduplicated"], pending=int(pending), seconds=elapsed,
    )


async def _pending(producer: AsyncProducer, stream: str) -> int:
    """Jobs not yet settled: held (from the stream or the group's retry stream) or waiting
    for a retry."""
    client, g = producer._redis, StreamKeys.for_stream(stream).group(Billing.group)
    held = int((await client.xpending(stream, Billing.group))["pending"])
    if await client.exists(g.retry):
        held += int((await client.xpending(g.retry, Billing.group))["pending"])
    return held + int(await client.zcard(g.retries))


def run_demo(url: str, orders: int = 2000, console: Console | None = None) -> DemoResult:
    """Run the demo against ``url``, or a private server when nothing answers there."""
    console = console or Console()
    server: RedisServer | None = None
    if not _reachable(url):
        console.print(f"No Redis at {url}; starting a private server for the demo.")
        server = RedisServer().start()
        url = server.url
    try:
        console.print(f"Using Redis at {url}")
        result = asyncio.run(_run(url, orders, console))
    finally:
        if server:
            server.close()
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
    verdict = "[green]OK: every order charged once or dead-lettered" if result.ok else (
        "[red]FAILED: an order was lost or charged twice")
    console.print(verdict)
    return result
