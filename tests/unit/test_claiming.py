"""The claimer and the reader's pacing (streamwork._worker.core.loops.claiming, .filling): the
bookkeeping around claim.lua, without Redis (the lease step is the caller's; real-Redis
behaviour under OOM, BUSY, restarts is in tests/faults/test_fault_matrix.py)."""

from __future__ import annotations

import asyncio

import pytest

from streamwork._wire.message import Message
from streamwork._worker.core.delivery import MAIN, Delivery
from streamwork._worker.core.loops.claiming import Claimer
from streamwork._worker.core.loops.filling import Fill


def _delivery(i: int) -> Delivery:
    entry_id = f"1-{i}".encode()
    msg: Message[dict[str, int]] = Message(f"1-{i}", "s", f"k{i}", {}, 1, 0.0, {})
    return Delivery(entry_id, MAIN, msg, b"", None, entry_id)


class Leases:
    """The lease step: records each call's batch; leased ones leave ``waiting``; raises
    while ``failing``."""

    def __init__(self, waiting: dict[bytes, Delivery]) -> None:
        self.waiting = waiting
        self.calls: list[list[str]] = []
        self.failing = False

    async def lease(self, batch: list[Delivery]) -> bool:
        self.calls.append([d.msg.key for d in batch])
        if self.failing:
            raise ConnectionError("Redis is down")
        for d in batch:
            self.waiting.pop(d.ref, None)
        return True


def _setup(n: int, batch_size: int) -> tuple[Claimer, Leases, list[Delivery]]:
    waiting: dict[bytes, Delivery] = {}
    ds = [_delivery(i) for i in range(n)]
    for d in ds:
        waiting[d.ref] = d
    leases = Leases(waiting)
    return Claimer(waiting, batch_size, leases.lease), leases, ds


async def test_the_claimer_leases_what_was_admitted_a_batch_at_a_time_in_order() -> None:
    claimer, leases, ds = _setup(5, batch_size=2)
    claimer.add(ds[:3])
    claimer.add(ds[3:])
    while leases.waiting:
        assert await claimer.claim_once()
    assert leases.calls == [["k0", "k1"], ["k2", "k3"], ["k4"]]


async def test_a_delivery_let_go_before_its_claim_is_not_leased() -> None:
    claimer, leases, ds = _setup(3, batch_size=10)
    claimer.add(ds)
    del leases.waiting[ds[1].ref]  # let go meanwhile (e.g. stopping while paused)
    assert await claimer.claim_once()
    assert leases.calls == [["k0", "k2"]]
    claimer.add([ds[1]])  # only it, no longer waiting: Redis is not asked
    assert not await claimer.claim_once()
    assert leases.calls == [["k0", "k2"]]


async def test_a_failed_claim_leaves_its_deliveries_waiting_for_the_leaser() -> None:
    claimer, leases, ds = _setup(2, batch_size=10)
    claimer._pause = 0.0  # the leaser's first pause (0.2 s), not what is tested here
    claimer.add(ds)
    leases.failing = True
    with pytest.raises(ConnectionError):
        await claimer.claim_once()
    assert set(leases.waiting) == {d.ref for d in ds}  # nothing lost
    leases.failing = False
    assert await claimer.retry_once()
    assert leases.calls[-1] == ["k0", "k1"] and not leases.waiting


async def test_an_idle_claimer_waits_for_work() -> None:
    claimer, leases, ds = _setup(1, batch_size=10)
    waiter = asyncio.ensure_future(claimer.claim_once())
    await asyncio.sleep(0)
    assert not waiter.done()
    claimer.add(ds)
    assert await waiter is False  # woken; the next step leases
    assert await claimer.claim_once() and leases.calls == [["k0"]]


async def test_a_busy_reader_waits_for_half_a_batch_of_room_and_no_longer_than_fill_wait(
        ) -> None:
    room = asyncio.Event()
    fill = Fill(room, low=50)
    assert not await fill.short(50)  # room enough: read now
    # short of room, woken as deliveries leave: keep waiting (the caller looks again)
    waiting = asyncio.ensure_future(fill.short(10))
    await asyncio.sleep(0)
    room.set()
    assert await waiting is True
    # still short once FILL_WAIT has passed since it first fell short (nothing wakes it
    # now): read what fits, after at most one more wait
    calls = 1
    while await fill.short(10):
        calls += 1
        assert calls <= 3
    # the window starts again: short of room, it waits once more; with room, it reads
    assert await fill.short(10)
    assert not await fill.short(60)
