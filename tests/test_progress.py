"""Progress (``msg.progress``): a handler reports how far it got, at no round trip of its
own; the worker writes the last value with its heartbeat (at most one write per beat, however
often the handler reports), and `status()`, ``streamwork job`` and the span show it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner

import streamwork as sw
from streamwork._cli.main import main
from streamwork._wire.keys import StreamKeys
from streamwork.testing import await_for, run_until_idle

STREAM = "prog"
GROUP = "g"
PROGRESS_KEY = StreamKeys.for_stream(STREAM).group(GROUP).progress("report")


class Reporting(sw.StreamWorker):
    """Reports progress ``calls`` times over ``seconds``, then waits for ``release``."""

    stream = STREAM
    group = GROUP
    read_block = 0.05
    visibility_timeout = 1.5  # a heartbeat every 0.5 s

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = asyncio.Event()
        self.reported = 0

    async def handle(self, msg: sw.Message) -> str:
        calls, seconds = msg.payload["calls"], msg.payload["seconds"]
        for i in range(1, calls + 1):
            msg.progress(i / calls, note=f"step {i} of {calls}")
            self.reported += 1
            await asyncio.sleep(seconds / calls)
        await self.release.wait()
        return "finished"


def _count_writes(url: str, key: str, stop: threading.Event, seen: list[float]) -> None:
    """Append the time of every write of ``key`` (keyspace notifications) until ``stop``."""
    client = redis.Redis.from_url(url)
    pubsub = client.pubsub()
    pubsub.subscribe(f"__keyspace@0__:{key}")
    try:
        while not stop.is_set():
            m = pubsub.get_message(timeout=0.05)
            if m and m["type"] == "message" and m["data"] == b"set":
                seen.append(time.monotonic())
    finally:
        pubsub.close()
        client.close()


async def test_a_thousand_reports_a_second_cost_one_write_per_heartbeat(
        redis_url: str, r: redis.Redis) -> None:
    """1,000 reports in about a second: the progress record is written at most once per
    heartbeat (0.5 s) while the job runs, its last value is what status() and the CLI read,
    and once the handler stops reporting no more writes come."""
    r.config_set("notify-keyspace-events", "K$")
    stop, writes = threading.Event(), []
    counter = threading.Thread(target=_count_writes, args=(redis_url, PROGRESS_KEY, stop,
                                                           writes))
    counter.start()
    try:
        w = Reporting.from_url(redis_url)
        task = asyncio.create_task(w.serve())
        with sw.Producer.from_url(redis_url) as p:
            await asyncio.sleep(0.3)  # let the subscription land (not an assertion)
            p.send(STREAM, {"calls": 1000, "seconds": 1.0}, key="report")
            await await_for(lambda: w.reported == 1000, timeout=30,
                            message="the handler reported 1,000 times")
            began = time.monotonic()
            st = await await_for(
                lambda: (s := p.status(STREAM, "report", group=GROUP)).progress == 1.0 and s,
                timeout=10, message="status shows the last report")
            assert st.state == "running"
            assert st.progress_note == "step 1000 of 1000"
            assert st.progress_at is not None and abs(st.progress_at - time.time()) < 30
            out = CliRunner().invoke(main, ["job", STREAM, "report", "--url", redis_url])
            assert out.exit_code == 0, out.output
            assert "progress: 100%" in out.output and "step 1000 of 1000" in out.output
            as_json = CliRunner().invoke(main, ["job", STREAM, "report", "--url", redis_url,
                                                "--json"])
            assert json.loads(as_json.output)["progress"] == 1.0
            # two more heartbeats (1 s) pass without a report: no write, the record only
            # kept (an absence needs a window to be seen in)
            settled = len(writes)
            await asyncio.sleep(max(0.0, began + 1.2 - time.monotonic()))
            assert len(writes) == settled
            # past two visibility timeouts without a report, the record is still kept
            await asyncio.sleep(max(0.0, began + 3.2 - time.monotonic()))
            assert p.status(STREAM, "report", group=GROUP).progress == 1.0
            w.release.set()
            await await_for(lambda: p.status(STREAM, "report", group=GROUP).state == "done",
                            timeout=10)
        w.stop()
        await asyncio.wait_for(task, 10)
    finally:
        stop.set()
        counter.join(5)
    # the reports spanned ~1 s of beats every 0.5 s (a busy machine stretches it): one
    # write per beat at most, so a handful, never one per report
    span = writes[-1] - writes[0] if writes else 0.0
    assert 1 <= len(writes) <= span / 0.5 + 2, (len(writes), span)
    assert len(writes) < 20
    print(f"progress: 1,000 reports, {len(writes)} writes over {span:.2f} s")


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), True, "half", None])
def test_a_fraction_outside_zero_to_one_is_refused(bad: Any) -> None:
    msg: sw.Message[Any] = sw.Message(id="1-0", stream=STREAM, key="k", payload={},
                                      attempt=1, enqueued_at=0.0, headers={})
    with pytest.raises(ValueError, match=r"fraction must be a number from 0\.0 to 1\.0"):
        msg.progress(bad)
    with pytest.raises(ValueError, match="note must be a str of at most 200"):
        msg.progress(0.5, note="x" * 201)


async def test_a_job_that_never_reports_has_no_progress(redis_url: str,
                                                      r: redis.Redis) -> None:
    """No report, no progress record: status() says None and the CLI shows no line."""

    class Quiet(sw.StreamWorker):
        stream = "prog-quiet"
        group = GROUP
        read_block = 0.05

        async def handle(self, msg: sw.Message) -> None:
            return None

    with sw.Producer.from_url(redis_url) as p:
        p.send("prog-quiet", {}, key="k")
        w = Quiet.from_url(redis_url)
        await run_until_idle(w, r)
        st = p.status("prog-quiet", "k", group=GROUP)
    assert st.state == "done" and st.progress is None and st.progress_note == ""
    out = CliRunner().invoke(main, ["job", "prog-quiet", "k", "--url", redis_url])
    assert out.exit_code == 0 and "progress" not in out.output
