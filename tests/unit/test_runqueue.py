"""RunQueue (streamwork._worker.core.runqueue): first in first out, chained wake-ups of parked
runners, and eager wake-ups with job records. Pure asyncio, no Redis."""

from __future__ import annotations

import asyncio
from typing import Any

from streamwork._worker.core.gate import Gate
from streamwork._worker.core.runqueue import RunQueue


def _items(n: int) -> list[Any]:
    return [object() for _ in range(n)]


async def test_ready_items_come_out_in_order_without_waiting() -> None:
    q = RunQueue(Gate())
    items = _items(3)
    q.put_many(items)
    assert [await q.get() for _ in items] == items
    assert not q.ready


async def test_a_parked_runner_gets_what_is_put_later() -> None:
    q = RunQueue(Gate())
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    item = object()
    q.put_many([item])  # type: ignore[list-item]
    assert await asyncio.wait_for(getter, 1) is item
    assert q.waking == 0


async def test_wake_ups_are_chained_one_runner_at_a_time() -> None:
    q = RunQueue(Gate())
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0)  # all three parked
    items = _items(3)
    q.put_many(items)
    assert q.waking == 1  # one woken; it wakes the next when it takes its delivery
    got = await asyncio.wait_for(asyncio.gather(*getters), 1)
    assert sorted(map(id, got)) == sorted(map(id, items))
    assert q.waking == 0 and not q.ready


async def test_eager_wakes_a_runner_per_ready_delivery_at_once() -> None:
    q = RunQueue(Gate(), eager=True)
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0)
    q.put_many(_items(2))
    assert q.waking == 2  # one per ready delivery, the third stays parked
    await asyncio.wait_for(asyncio.gather(*getters[:2]), 1)
    assert not getters[2].done()
    getters[2].cancel()


async def test_a_woken_runner_cancelled_before_it_runs_passes_the_wake_up_on() -> None:
    q = RunQueue(Gate())
    first = asyncio.create_task(q.get())
    second = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    item = object()
    q.put_many([item])  # type: ignore[list-item]
    assert q.waking == 1
    first.cancel()  # woken, then cancelled before it took the delivery
    assert await asyncio.wait_for(second, 1) is item
    assert first.cancelled() and q.waking == 0


async def test_kick_without_parked_runners_does_nothing() -> None:
    q = RunQueue(Gate())
    q.put_many(_items(2))
    q.kick()
    assert q.waking == 0 and len(q.ready) == 2


async def test_deferred_wakes_runners_at_the_turns_end_for_what_is_still_ready() -> None:
    q = RunQueue(Gate())
    q.deferred = True
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0)  # all three parked
    items = _items(3)
    q.put_many(items)
    assert q.waking == 0  # nobody woken yet: a runner still in its turn may take them
    assert q.ready.popleft() is items[0]  # ... as one does here, without a wake-up
    await asyncio.sleep(0)  # the turn ends: one runner per delivery still ready, at once
    assert q.waking == 2
    got = await asyncio.wait_for(asyncio.gather(*getters[:2]), 1)
    assert sorted(map(id, got)) == sorted(map(id, items[1:]))
    assert not getters[2].done() and q.waking == 0
    getters[2].cancel()


async def test_feed_takes_what_is_put_and_on_idle_hears_of_each_parked_runner() -> None:
    q = RunQueue(Gate())
    fed: list[Any] = []
    parked: list[int] = []
    q.feed = fed.extend
    q.on_idle = lambda: parked.append(q.idle())
    items = _items(2)
    q.put_many(items)
    assert fed == items and not q.ready  # the feed puts them in ready when they may run
    getters = [asyncio.create_task(q.get()) for _ in range(2)]
    await asyncio.sleep(0)
    assert parked == [1, 2]  # idle runners, as each parks
    q.ready.append(items[0])
    assert q.idle() == 1  # one of the two has a delivery waiting for it
    q.kick()
    assert await asyncio.wait_for(getters[0], 1) is items[0]
    getters[1].cancel()


async def test_a_getter_with_a_deadline_returns_none_once_it_passes() -> None:
    """get(until): None once the loop's time passes ``until`` with nothing put, and the
    queue's count of woken runners stays right (a later put wakes the next runner)."""
    q = RunQueue(Gate())
    loop = asyncio.get_running_loop()
    assert await asyncio.wait_for(q.get(loop.time() + 0.01), 1) is None
    assert q.waking == 0
    parked = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    item = object()
    q.put_many([item])  # type: ignore[list-item]
    assert await asyncio.wait_for(parked, 1) is item
    assert q.waking == 0


async def test_a_runner_filling_its_batch_is_woken_before_idle_ones() -> None:
    """A batch runner waiting for more (get with a deadline) takes the next delivery
    before a runner that parked earlier with nothing."""
    q = RunQueue(Gate())
    loop = asyncio.get_running_loop()
    idle = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    filling = asyncio.create_task(q.get(loop.time() + 5))
    await asyncio.sleep(0)
    item = object()
    q.put_many([item])  # type: ignore[list-item]
    assert await asyncio.wait_for(filling, 1) is item
    assert not idle.done()
    idle.cancel()
