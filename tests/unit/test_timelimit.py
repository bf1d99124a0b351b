"""TimeLimit (streamwork._worker.core.timelimit): one timer per runner that stops each job at
its own limit. Driven on a real event loop with short limits; no Redis."""

from __future__ import annotations

import asyncio

from streamwork._worker.core.timelimit import TimeLimit, uncancel


async def _until(cond: object, timeout: float = 2.0) -> None:
    async def wait() -> None:
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.001)
    await asyncio.wait_for(wait(), timeout)


async def test_a_job_past_its_limit_is_reported_once() -> None:
    loop = asyncio.get_running_loop()
    due: list[str] = []
    watch: TimeLimit[str] = TimeLimit(loop, due.append)
    watch.start("job", loop.time() + 0.01)
    await _until(lambda: due)
    assert due == ["job"] and watch.timer is None  # fired, and not armed again
    watch.close()


async def test_a_job_that_ends_in_time_is_not_reported() -> None:
    loop = asyncio.get_running_loop()
    due: list[str] = []
    watch: TimeLimit[str] = TimeLimit(loop, due.append)
    watch.start("quick", loop.time() + 0.01)
    watch.stop()
    await _until(lambda: watch.timer is None)  # the timer fired with no job running
    assert due == []
    watch.close()


async def test_the_timer_armed_for_an_earlier_job_re_arms_for_a_later_limit() -> None:
    """The first job's timer is kept; it fires before the second job's limit and re-arms
    for it, so the second job is stopped at its own limit, not the first one's."""
    loop = asyncio.get_running_loop()
    due: list[tuple[str, float]] = []
    watch: TimeLimit[str] = TimeLimit(loop, lambda job: due.append((job, loop.time())))
    watch.start("first", loop.time() + 0.01)
    watch.stop()
    limit = loop.time() + 0.06
    watch.start("second", limit)
    assert watch.when < limit  # still the first job's timer
    await _until(lambda: due)
    assert due[0][0] == "second" and due[0][1] >= limit
    watch.close()


async def test_a_sooner_limit_re_arms_the_timer_earlier() -> None:
    loop = asyncio.get_running_loop()
    due: list[str] = []
    watch: TimeLimit[str] = TimeLimit(loop, due.append)
    watch.start("slow", loop.time() + 10)
    watch.stop()
    watch.start("fast", loop.time() + 0.01)
    await _until(lambda: due)
    assert due == ["fast"]
    watch.close()


async def test_close_disarms_the_timer() -> None:
    loop = asyncio.get_running_loop()
    due: list[str] = []
    watch: TimeLimit[str] = TimeLimit(loop, due.append)
    watch.start("job", loop.time() + 0.01)
    timer = watch.timer
    watch.close()
    assert timer is not None and timer.cancelled() and watch.timer is None
    assert watch.job is None and due == []


async def test_uncancel_withdraws_the_cancellation_it_made() -> None:
    async def sleeper() -> None:
        await asyncio.sleep(10)

    task = asyncio.create_task(sleeper())
    await asyncio.sleep(0)
    task.cancel()
    uncancel(task)
    if hasattr(task, "cancelling"):  # Python 3.11+ counts cancellations
        assert task.cancelling() == 0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
