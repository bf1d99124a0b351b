"""``streamwork job`` (what a group knows of one job) and ``streamwork cancel``; with
``--partitions P``, from whichever partition holds the job's record."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

import click

from streamwork._cli.common import (
    check_recorded_partitions,
    detect_partitions,
    fail,
    partition_streams,
)
from streamwork._cli.views import redis_errors
from streamwork._producer.shells import Producer
from streamwork._redis import connection
from streamwork._wire.extensions import to_json
from streamwork._wire.partitions import partition_of
from streamwork._wire.records import CANCEL_EFFECTS
from streamwork.errors import StreamworkError

__all__ = ["cancel_command", "job_command"]


def _found_in(producer: Producer, picked: Sequence[tuple[int, str]], group: str,
              key: str) -> tuple[int, str] | None:
    """The partition whose record of job ``key`` the status came from: the key's own
    partition first (where the producer sent it, unless an order key chose another)."""
    home = partition_of(key, len(picked))
    for i, name in sorted(picked, key=lambda p: p[0] != home):
        if producer.status(name, key, group=group).state != "unknown":
            return i, name
    return None


def cancel_command(stream: str, key: str, group: str | None, reason: str,
                   order_key: str | None, url: str | None, given: int | None = None) -> None:
    """Body of ``streamwork cancel`` (see ``register``)."""
    partitions = detect_partitions(url, stream, given)
    partition_streams(stream, partitions, None)  # checks the name suits partitioning
    resolved = connection.resolve_url(url)
    with redis_errors(resolved, "streamwork cancel"):
        producer = Producer.from_url(resolved, partitions={stream: partitions})
        try:
            was = producer.cancel(stream, key, group=group, reason=reason, order_key=order_key)
        finally:
            producer.close()
    click.echo(f"{key}: {CANCEL_EFFECTS.get(was, was)}")


def job_command(stream: str, key: str, group: str | None, as_json: bool, url: str | None,
                given: int | None = None, partition: int | None = None) -> None:
    """Body of ``streamwork job`` (see ``register``)."""
    partitions = detect_partitions(url, stream, given)
    picked = partition_streams(stream, partitions, partition)
    where: tuple[int, str] | None = None
    if partitions > 1:
        resolved = connection.resolve_url(url)
        with redis_errors(resolved, "streamwork job"):
            client = connection.sync_client(resolved)
            try:
                check_recorded_partitions(client, stream, partitions)
            finally:
                client.close()
    try:
        joined = None
        if partitions == 1:
            with Producer.from_url(url) as producer:
                st = producer.status(stream, key, group=group)
                joined = producer.join_status(stream, key)  # a join of that key, if any
        else:
            # a mapping: the partitions' own names are plain streams to this producer
            with Producer.from_url(url, partitions={stream: partitions}) as producer:
                if partition is not None:
                    where = picked[0]
                    st = producer.status(where[1], key, group=group)
                else:
                    st = producer.status(stream, key, group=group)
                    if st.state != "unknown":
                        where = _found_in(producer, picked, st.group, key)
    except StreamworkError as exc:
        fail(str(exc))
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(st):
        fields[f.name] = getattr(st, f.name)
        if f.name == "stream" and partitions > 1:
            fields["partition"] = None if where is None else where[0]
            fields["partition_stream"] = None if where is None else where[1]
    if joined is not None and joined.state != "unknown":
        fields["join"] = {"state": joined.state, "total": joined.total, "done": joined.done,
                          "failed": joined.failed, "pending": joined.pending,
                          "policy": joined.policy}
    if as_json:
        fields["result"] = to_json(st.result)  # Decimal, datetime, ...: str, ISO 8601
        click.echo(json.dumps(fields, default=repr, ensure_ascii=False))
        return
    for name, value in fields.items():
        if name == "partition_stream":
            continue
        if name == "partition":
            value = "none has a record" if where is None else f"{where[0]} ({where[1]})"
        if value in (None, "") and name not in ("state", "result"):
            continue
        if name in ("updated_at", "due", "progress_at") and value is not None:
            value = f"{value:.3f} ({_ago(value)})"
        if name == "progress" and value is not None:
            value = f"{value:.0%}"
        if name == "join":
            value = (f"{value['state']}: {value['total']} children, {value['done']} done, "
                     f"{value['failed']} failed, {value['pending']} pending "
                     f"(on_failure={value['policy']})")
        shown = repr(value) if name == "result" else str(value)
        # a traceback's lines line up under the first one's value, not at the margin
        click.echo(f"{name:>15}: " + shown.rstrip("\n").replace("\n", "\n" + " " * 17))


def _ago(when: float) -> str:
    delta = time.time() - when
    return f"{delta:.1f} s ago" if delta >= 0 else f"in {-delta:.1f} s"
