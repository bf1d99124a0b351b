"""Golden vectors for docs/reference/wire-format.md and docs/reference/keys.md: bodies,
delayed-set members and job records that streamwork writes, decoded by a small decoder
written from those two pages alone (the first half of this module: it imports nothing of
streamwork, only msgpack), and checked against what streamwork itself says of them
(`Producer.status`, the handler's `msg`). A rule the pages get wrong, or a record the
pages do not describe, fails here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import re
import time
import uuid
import zlib
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import msgpack
import pytest
import redis

# ---- the decoder: the pages' rules, nothing else ---------------------------------------------

_DECIMAL = re.compile(rb"^-?(\d+(\.\d+)?([Ee][+-]?\d+)?|NaN|sNaN|Infinity)$")


def prefix(stream: str) -> str:
    """keys.md: ``{S}``, or ``{tag}~<len>:S`` for a name that carries its own ``{tag}``."""
    tag = re.search(r"\{[^{}]+\}", stream)
    if tag is None:
        return "{" + stream + "}"
    return f"{tag.group(0)}~{len(stream.encode())}:{stream}"


def record_key(stream: str, group: str, key: str) -> str:
    """keys.md: ``<prefix>:job:<len>:G:K``, ``<len>`` the group's UTF-8 bytes."""
    return f"{prefix(stream)}:job:{len(group.encode())}:{group}:{key}"


def progress_key(stream: str, group: str, key: str) -> str:
    """keys.md: the progress record beside the job record, ``<prefix>:progress:...``."""
    return f"{prefix(stream)}:progress:{len(group.encode())}:{group}:{key}"


def decode_progress(raw: bytes) -> dict[str, Any]:
    """keys.md: MessagePack ``[fraction, note, reported Unix ms]``."""
    fraction, note, at = unpack(raw)
    assert 0 <= fraction <= 1 and isinstance(note, str) and isinstance(at, int)
    return {"fraction": fraction, "note": note, "at_ms": at}


def _crc16(data: bytes) -> int:
    """CRC16 as Redis Cluster computes key slots (XMODEM: polynomial 0x1021, start 0)."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xFFFF
    return crc


def partition_stream(stream: str, count: int, order_key: str) -> str:
    """wire-format.md, "Partitioned streams": the stream ``S#i.n`` a job goes to."""
    i = zlib.crc32(order_key.encode()) % count
    width = 16384 / count
    low, high = math.ceil(i * width + width / 4), math.floor((i + 1) * width - width / 4)
    n = 0
    while not low <= _crc16(f"{stream}#{i}.{n}".encode()) % 16384 < high:
        n += 1
    return f"{stream}#{i}.{n}"


def _ext(code: int, data: bytes) -> Any:
    """wire-format.md, "Extension types" (-1, the timestamp, is msgpack's own)."""
    if code == 1:
        assert _DECIMAL.match(data), data
        return Decimal(data.decode("ascii"))
    if code == 2:
        assert len(data) == 16
        return uuid.UUID(bytes=data)
    if code == 3:
        assert re.fullmatch(rb"\d{4}-\d{2}-\d{2}", data), data
        return dt.date.fromisoformat(data.decode("ascii"))
    return msgpack.ExtType(code, data)


def unpack(data: bytes) -> Any:
    """MessagePack with the pages' extension types; a timestamp as an aware UTC datetime."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False, timestamp=3, ext_hook=_ext)


def decode_body(data: bytes) -> dict[str, Any]:
    """wire-format.md, "Stream entries": the body's fields, checked; ``options`` by field
    of ``o`` (``l`` as seconds, ``ex`` as a datetime), unknown fields ignored."""
    body = unpack(data)
    assert isinstance(body, dict)
    assert body["v"] in (1, 2, 3)
    assert isinstance(body["k"], str) and body["k"]
    assert isinstance(body["t"], int) and body["t"] >= 0
    headers = body.get("h", {})
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    options: dict[str, Any] = {}
    for field, value in body.get("o", {}).items():
        if field == "l":
            assert isinstance(value, int) and value > 0
            options["timeout"] = value / 1000
        elif field == "ok":
            assert isinstance(value, str) and value
            options["order_key"] = value
        elif field == "pr":
            assert value in ("high", "low")
            options["priority"] = value
        elif field == "ex":
            assert isinstance(value, int) and value > 0
            options["expires"] = dt.datetime.fromtimestamp(value / 1000, dt.timezone.utc)
    if "o" in body:
        assert body["o"], "o is left out when the job has no options"
    return {"key": body["k"], "enqueued_ms": body["t"], "headers": headers,
            "payload": body["p"], "options": options}


def decode_delayed(member: bytes) -> dict[str, Any]:
    """keys.md, "Delayed jobs": ``0:`` + 32 random hex digits + ``:`` + the body."""
    found = re.fullmatch(rb"0:([0-9a-f]{32}):(.*)", member, re.S)
    assert found is not None, member[:40]
    return decode_body(found.group(2))


def decode_record(raw: bytes | None, now_ms: float | None = None) -> dict[str, Any]:
    """keys.md, "What a job record holds": a status from a record's bytes."""
    now_ms = time.time() * 1000 if now_ms is None else now_ms
    out: dict[str, Any] = {"state": "unknown", "attempts": 0, "result": None, "note": "",
                           "error": "", "reason": "", "updated_ms": None, "due_ms": None,
                           "dead_letter_id": None, "token": None}
    if not raw:
        return out
    kind, rest = raw[:1], raw[1:]
    if kind in (b"H", b"R"):
        parts = rest.decode("utf-8").split("|", 5)
        owner, token = parts[0].rsplit(":", 1)  # the owner holds colons: the last one
        attempt, out["updated_ms"] = int(parts[1]), int(parts[2])
        out["token"], out["owner"] = int(token), owner
        extra = parts[3] if len(parts) > 3 else ""
        if kind == b"H":
            out["attempts"] = attempt - 1
            if extra.startswith("W"):
                out.update(state="waiting", due_ms=int(extra[1:]))
            else:
                out["state"] = "queued"
            return out
        out["attempts"] = attempt
        if extra.startswith("C"):
            deadline, out["cancel_ttl_ms"], why = int(extra[1:]), int(parts[4]), parts[5]
            out.update(state="cancelled" if deadline <= now_ms else "running", reason=why,
                       cancel_asked=True)
        else:
            out["state"] = "running"
        return out
    fields = unpack(rest)
    if kind == b"D":
        token, attempts, updated, result, note = fields
        out.update(state="done", token=token or None, attempts=attempts, updated_ms=updated,
                   result=result, note=note)
    elif kind == b"W":
        attempts, updated, due, error = fields
        out.update(state="waiting", attempts=attempts, updated_ms=updated, due_ms=due,
                   error=error)
    elif kind == b"X":
        attempts, updated, dead_id, reason, error = fields
        out.update(state="dead", attempts=attempts, updated_ms=updated, dead_letter_id=dead_id,
                   reason=reason, error=error)
    elif kind == b"C":
        updated, reason = fields
        out.update(state="cancelled", updated_ms=updated, reason=reason)
    elif kind == b"E":
        attempts, updated, state, reason = fields
        out.update(state=state, attempts=attempts, updated_ms=updated, reason=reason)
    else:
        raise AssertionError(f"a first byte the pages do not describe: {raw[:1]!r}")
    return out


# ---- the vectors: written by streamwork --------------------------------------------------

import streamwork as sw  # noqa: E402  (the decoder above must not use it)
from streamwork.testing import run_until_idle  # noqa: E402


def _entries(r: redis.Redis, stream: str) -> list[dict[str, Any]]:
    out = []
    for _, fields in r.xrange(stream):
        assert set(fields) == {b"d"}, "a producer writes the body only"
        out.append(decode_body(fields[b"d"]))
    return out


def test_plain_and_keyed_bodies_with_options(redis_url: str, r: redis.Redis) -> None:
    """A plain job has a random 32-hex key and no ``o``; a keyed one its key, and each
    option that is not its default under its field; payload ext types as the page says."""
    at = dt.datetime(2026, 12, 1, 7, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    payload = {"amount": Decimal("-1.5E+7"), "id": uuid.UUID(int=7), "day": dt.date(2026, 12, 1),
               "at": at, "raw": b"\x00\xff", "list": [1, 2.5, None, True]}
    with sw.Producer.from_url(redis_url) as producer:
        producer.send("orders", {"n": 1})
        producer.send("orders", payload, key="order-7", headers={"tenant": "eu"}, timeout=2.5,
                      order_key="customer-7", expires=3600)
        producer.send("orders", {"n": 2}, key="order-8", order_key="order-8",
                      priority="normal")
    plain, keyed, defaults = _entries(r, "orders")
    for entry in (plain, keyed, defaults):  # a trace context, when another test of this
        entry["headers"].pop("traceparent", None)  # process installed a tracer provider
        entry["headers"].pop("tracestate", None)
    assert re.fullmatch(r"[0-9a-f]{32}", plain["key"])
    assert plain["options"] == {} and plain["headers"] == {}
    assert abs(plain["enqueued_ms"] - time.time() * 1000) < 60_000
    assert keyed["key"] == "order-7" and keyed["headers"] == {"tenant": "eu"}
    assert keyed["payload"] == {**payload, "at": at.astimezone(dt.timezone.utc)}
    expires = keyed["options"].pop("expires")
    assert keyed["options"] == {"timeout": 2.5, "order_key": "customer-7"}
    assert abs(expires.timestamp() - (time.time() + 3600)) < 60
    assert defaults["options"] == {}, "an order key equal to the key, priority normal"


def test_priority_jobs_are_on_the_level_streams(redis_url: str, r: redis.Redis) -> None:
    """``high`` and ``low`` jobs are entries of ``<prefix>:p:high`` / ``:p:low``, with
    ``pr``; the stream itself holds the normal ones."""
    with sw.Producer.from_url(redis_url) as producer:
        producer.send("orders", {}, key="a", priority="high")
        producer.send("orders", {}, key="b", priority="low")
        producer.send("orders", {}, key="c")
    assert [e["options"] for e in _entries(r, prefix("orders") + ":p:high")] == \
        [{"priority": "high"}]
    assert [e["options"] for e in _entries(r, prefix("orders") + ":p:low")] == \
        [{"priority": "low"}]
    assert [e["key"] for e in _entries(r, "orders")] == ["c"]


def test_partitioned_streams(redis_url: str, r: redis.Redis) -> None:
    """A partitioned stream records its count in ``<prefix>:partitions``, and each job is
    on the partition the page's rule picks from its order key (else its key)."""
    keys = [f"user-{n}" for n in range(12)]
    with sw.Producer.from_url(redis_url, partitions=4) as producer:
        for key in keys:
            producer.send("events", {}, key=key)
        producer.send("events", {}, key="by-order", order_key="user-3")
    assert r.get(prefix("events") + ":partitions") == b"4"
    for key in keys:
        on = [e["key"] for e in _entries(r, partition_stream("events", 4, key))]
        assert key in on, (key, partition_stream("events", 4, key))
    assert "by-order" in [e["key"] for e in _entries(r, partition_stream("events", 4, "user-3"))]
    used = {partition_stream("events", 4, k) for k in keys}
    assert sum(r.xlen(name) for name in used) == len(keys) + 1, "nowhere else"


def test_delayed_members(redis_url: str, r: redis.Redis) -> None:
    """A delayed job is a member of ``<prefix>:delayed`` scored by its due Unix ms: a
    delay on the server's clock, ``at`` as given; the body as in a stream entry."""
    at = dt.datetime(2030, 1, 1, 6, 0, tzinfo=dt.timezone.utc)
    before = r.time()
    with sw.Producer.from_url(redis_url) as producer:
        producer.send("orders", {"n": 1}, key="later", delay=60, timeout=5)
        producer.send("orders", {"n": 2}, key="then", at=at)
    after = r.time()
    members = {decode_delayed(m)["key"]: (decode_delayed(m), score)
               for m, score in r.zrange(prefix("orders") + ":delayed", 0, -1, withscores=True)}
    later, due = members["later"]
    assert later["options"] == {"timeout": 5.0} and later["payload"] == {"n": 1}
    assert before[0] * 1000 + 60_000 <= due <= (after[0] + 1) * 1000 + 60_000
    then, due = members["then"]
    assert then["options"] == {} and due == at.timestamp() * 1000
    assert not r.exists("orders"), "nothing on the stream until it falls due"


class _Gate:
    """Lets a test hold handlers until it has read their records."""

    event: asyncio.Event | None = None


class _Jobs(sw.StreamWorker):
    """Each job's key says what its handler does."""

    stream = "{shop}:eu"  # a name with its own tag: the page's other prefix rule
    group = "billing:v2"
    concurrency = 1
    read_block = 0.05
    retry_delay = 60.0
    visibility_timeout = 1.5  # a heartbeat (which writes the progress) every 0.5 s

    async def handle(self, msg: sw.Message) -> Any:
        if msg.key.startswith("retry"):
            raise RuntimeError("card declined")
        if msg.key.startswith("dead"):
            raise sw.DeadLetter("no such customer")
        if msg.key.startswith("hold"):
            assert _Gate.event is not None
            msg.progress(0.5, "half way")
            await _Gate.event.wait()
        return {"total": Decimal("12.50"), "key": msg.key}


async def _wait_record(r: redis.Redis, key: str, test: Callable[[bytes], bool]) -> bytes:
    """The record ``key`` once ``test`` holds for it (polled from a thread: the worker's
    loop must not wait on a synchronous call)."""
    deadline = time.monotonic() + 30
    while True:
        raw = await asyncio.to_thread(r.get, key)
        if raw is not None and test(raw):
            return raw
        assert time.monotonic() < deadline, f"{key}: {raw!r}"
        await asyncio.sleep(0.02)


async def _wait_any(r: redis.Redis, keys: list[str], test: Callable[[bytes], bool]) -> bytes:
    """The first of the records ``keys`` for which ``test`` holds (polled as above)."""
    deadline = time.monotonic() + 30
    while True:
        for raw in await asyncio.to_thread(r.mget, keys):
            if raw is not None and test(raw):
                return bytes(raw)
        assert time.monotonic() < deadline, keys
        await asyncio.sleep(0.02)


def _agrees(mine: dict[str, Any], theirs: sw.JobStatus) -> None:
    """What the page's decoder read says what `Producer.status` says of the same record."""
    assert mine["state"] == theirs.state
    assert mine["attempts"] == theirs.attempts
    assert mine["result"] == theirs.result
    assert mine["error"] == theirs.error
    assert mine["token"] == theirs.fencing_token
    assert mine["dead_letter_id"] == theirs.dead_letter_id
    if mine.get("cancel_asked") and mine["state"] == "running":
        assert theirs.reason == f"cancel requested: {mine['reason']}"
    elif "owner" not in mine:  # a held record's reason is the status's own wording
        assert mine["reason"] == theirs.reason
    if mine["updated_ms"] is None:
        assert theirs.updated_at is None
    else:
        assert theirs.updated_at == pytest.approx(mine["updated_ms"] / 1000)
    if mine["due_ms"] is not None:
        assert theirs.due == pytest.approx(mine["due_ms"] / 1000)


def test_job_records(redis_url: str, r: redis.Redis) -> None:
    """Every record state the keys page lists, as a worker writes it, decoded by the
    page's rules (the owner of a lease holds colons: this worker's consumer name has one)."""
    stream, group = _Jobs.stream, _Jobs.group
    soon = time.time() + 0.5
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(stream, {}, key="gone", expires=0.5)
        for key in ("done-1", "retry-1", "dead-1", "cancel-1"):
            producer.send(stream, {}, key=key)
        assert producer.cancel(stream, "cancel-1", group=group, reason="asked") == "unknown"
    while time.time() < soon + 0.1:  # let "gone" expire before any worker reads it
        time.sleep(0.05)

    def record(key: str) -> dict[str, Any]:
        return decode_record(r.get(record_key(stream, group, key)))

    async def scenario() -> dict[str, dict[str, Any]]:
        first = _Jobs.from_url(redis_url)
        serving = asyncio.create_task(first.serve())
        try:
            await _wait_record(r, record_key(stream, group, "dead-1"),
                               lambda v: v.startswith(b"X"))
        finally:
            first.stop()
            await serving
        # then three jobs for a fresh worker with one runner: the first runs and holds it,
        # the others are held, queued behind it
        with sw.Producer.from_url(redis_url) as producer:
            producer.send_many(stream, [{}, {}, {}], keys=["hold-1", "hold-2", "hold-3"])
        _Gate.event = asyncio.Event()
        worker = _Jobs.from_url(redis_url, consumer="host:7:a")
        serving = asyncio.create_task(worker.serve())
        seen = {}
        try:
            raw = await _wait_record(r, record_key(stream, group, "hold-1"),
                                     lambda v: v.startswith(b"R"))
            seen["running"] = decode_record(raw)
            seen["queued"] = decode_record(await _wait_any(
                r, [record_key(stream, group, f"hold-{n}") for n in (2, 3)],
                lambda v: v.startswith(b"H")))
            raw = await _wait_record(r, progress_key(stream, group, "hold-1"), bool)
            seen["progress"] = decode_progress(raw)
            with sw.Producer.from_url(redis_url) as producer:
                st = await asyncio.to_thread(producer.status, stream, "hold-1", group=group)
                assert (st.progress, st.progress_note) == (0.5, "half way")
                assert st.progress_at == pytest.approx(seen["progress"]["at_ms"] / 1000)
                assert producer.cancel(stream, "hold-1", group=group,
                                       reason="a|b") == "running"
            raw = await _wait_record(r, record_key(stream, group, "hold-1"),
                                     lambda v: b"|C" in v)
            seen["cancel asked"] = decode_record(raw)
        finally:
            _Gate.event.set()
            worker.stop()
            await serving
        return seen

    seen = asyncio.run(scenario())
    assert seen["running"]["owner"].startswith("host:7:a:"), seen["running"]
    assert seen["running"]["attempts"] == 1 and seen["running"]["token"] > 0
    assert seen["queued"]["attempts"] == 0
    assert seen["progress"]["fraction"] == 0.5 and seen["progress"]["note"] == "half way"
    assert seen["cancel asked"]["state"] == "running"
    assert seen["cancel asked"]["reason"] == "a|b"

    with sw.Producer.from_url(redis_url) as producer:
        def check(key: str, state: str) -> dict[str, Any]:
            mine = record(key)
            assert mine["state"] == state, (key, mine)
            _agrees(mine, producer.status(stream, key, group=group))
            return mine

        done = check("done-1", "done")
        assert done["result"] == {"total": Decimal("12.50"), "key": "done-1"}
        assert done["note"] == "" and done["token"] > 0
        waiting = check("retry-1", "waiting")
        assert waiting["error"].startswith("RuntimeError: card declined")
        assert waiting["due_ms"] > time.time() * 1000 + 30_000
        dead = check("dead-1", "dead")
        assert r.xrange(prefix(stream) + ":dead", dead["dead_letter_id"],
                        dead["dead_letter_id"]), "the dead letter's id is its entry in :dead"
        assert check("cancel-1", "cancelled")["reason"] == "asked"
        assert check("hold-1", "cancelled")["reason"] == "a|b"
        check("gone", "expired")
        assert check("never-sent", "unknown") == decode_record(None)


class _Ordered(sw.StreamWorker):
    """Ordered mode retries in place: the held record gets ``|W<due ms>``."""

    stream = "ledger"
    group = "books"
    ordered = True
    read_block = 0.05

    async def handle(self, msg: sw.Message) -> None:
        raise sw.Retry(delay=60)


def test_retry_in_place_record(redis_url: str, r: redis.Redis) -> None:
    """An ordered worker's retry in place is ``H...|W<due ms>``: waiting, attempts used."""
    with sw.Producer.from_url(redis_url) as producer:
        producer.send("ledger", {}, key="entry-1")

    async def scenario() -> bytes:
        worker = _Ordered.from_url(redis_url)
        serving = asyncio.create_task(worker.serve())
        try:
            return await _wait_record(r, record_key("ledger", "books", "entry-1"),
                                      lambda v: b"|W" in v)
        finally:
            worker.stop()
            await serving

    mine = decode_record(asyncio.run(scenario()))
    assert mine["state"] == "waiting" and mine["attempts"] == 1
    assert mine["due_ms"] > time.time() * 1000 + 30_000
    with sw.Producer.from_url(redis_url) as producer:
        _agrees(mine, producer.status("ledger", "entry-1", group="books"))


def test_a_delayed_job_falls_due_onto_the_stream(redis_url: str, r: redis.Redis) -> None:
    """A member written by the page's rules (as another language would) runs when due."""
    body = msgpack.packb({"v": 3, "k": "remind-1", "t": int(time.time() * 1000), "h": {},
                          "p": {"n": 1}, "o": {"l": 5000}})
    (now_s, now_us) = r.time()
    r.zadd(prefix("orders") + ":delayed",
           {b"0:" + uuid.uuid4().hex.encode() + b":" + body: now_s * 1000 + now_us // 1000})
    seen = []

    class Orders(sw.StreamWorker):
        stream = "orders"
        group = "billing"
        read_block = 0.05

        async def handle(self, msg: sw.Message) -> None:
            seen.append((msg.key, msg.payload, dict(msg.options)))

    asyncio.run(run_until_idle(Orders.from_url(redis_url), r))
    assert seen == [("remind-1", {"n": 1}, {"timeout": 5.0})]
    assert decode_record(r.get(record_key("orders", "billing", "remind-1")))["state"] == "done"
