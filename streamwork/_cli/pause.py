"""``streamwork pause`` and ``streamwork resume``: stop a consumer group's workers from
starting jobs, and let them go on (:meth:`streamwork.Producer.pause`).

Both refuse a stream that does not exist and a group the stream does not have (exit 1,
naming the groups it has), so a typo never pauses nothing. On a partitioned stream
(``--partitions P``, or the recorded count) every partition's group is paused.
"""

from __future__ import annotations

from typing import Any

import click
import redis

from streamwork._cli.common import (
    check_recorded_partitions,
    detect_partitions,
    fail,
    partition_streams,
    partitions_option,
    url_option,
)
from streamwork._cli.views import redis_errors
from streamwork._ops.format import fmt_when
from streamwork._producer.shells import Producer
from streamwork._redis import connection
from streamwork._redis.faults import denial
from streamwork.errors import GroupNotFound, StreamNotFound

__all__ = ["register"]


def _group_names(client: Any, streams: list[str]) -> list[str] | None:
    """The groups over ``streams`` (a stream's partitions), None when none of them exists."""
    names: set[str] = set()
    found = False
    for stream in streams:
        try:
            groups = client.xinfo_groups(stream)
        except redis.ResponseError as exc:
            if denial(exc) is not None:  # the user may not ask: said as such
                raise
            if "no such key" in str(exc).lower():
                continue
            raise StreamNotFound(stream, f"is not a stream ({exc})") from exc
        found = True
        names.update(g["name"].decode() if isinstance(g["name"], bytes) else str(g["name"])
                     for g in groups)
    return sorted(names) if found else None


def _producer(stream: str, group: str, url: str | None, given: int | None,
              what: str) -> tuple[Producer, str]:
    """A producer for ``stream`` (its partitions) once the stream and ``group`` are found
    on the server; the resolved URL with it."""
    partitions = detect_partitions(url, stream, given)
    streams = [name for _, name in partition_streams(stream, partitions, None)]
    resolved = connection.resolve_url(url)
    with redis_errors(resolved, what):
        client = connection.sync_client(resolved)
        try:
            check_recorded_partitions(client, stream, partitions)
            groups = _group_names(client, streams)
        finally:
            client.close()
        if groups is None:
            raise StreamNotFound(stream)
        if group not in groups:
            if not groups:
                fail(f"stream {stream!r} has no consumer group yet: a group is created when "
                     f"its first worker starts. Check the name, or start a worker first "
                     f"(Producer.pause can pause a group before any worker ran)")
            raise GroupNotFound(stream, group, groups)
    return Producer.from_url(resolved, partitions={stream: partitions}), resolved


def register(main: click.Group) -> None:
    """Add ``pause`` and ``resume`` to the ``streamwork`` command group (idempotent)."""
    @click.command("pause")
    @click.argument("stream")
    @click.option("--group", required=True, help="the consumer group to pause")
    @click.option("--reason", default="", help="why; shown by inspect, top, the dashboard "
                                               "and the workers' /readyz")
    @partitions_option("the stream is split into P partitions: pause the group in each")
    @url_option
    def pause(stream: str, group: str, reason: str, partitions: int | None,
              url: str | None) -> None:
        """Pause GROUP of STREAM: within about a second its workers start no job (one
        running finishes; held jobs stay theirs, nothing is redelivered). Jobs keep
        arriving and wait. The pause is kept in Redis until `streamwork resume`. Exit 0
        paused, 1 error (no such stream or group, Redis unreachable)."""
        producer, resolved = _producer(stream, group, url, partitions, "streamwork pause")
        with redis_errors(resolved, "streamwork pause"):
            try:
                state = producer.pause(stream, group, reason=reason)
            finally:
                producer.close()
        why = f" ({state.reason})" if state.reason else ""
        click.echo(f"{stream}/{group}: paused{why} at {fmt_when(state.since)}; its workers "
                   f"start no job until `streamwork resume {stream} --group {group}`")

    @click.command("resume")
    @click.argument("stream")
    @click.option("--group", required=True, help="the consumer group to resume")
    @partitions_option("the stream is split into P partitions: resume the group in each")
    @url_option
    def resume(stream: str, group: str, partitions: int | None, url: str | None) -> None:
        """Resume GROUP of STREAM: within about a second its workers start jobs again, the
        ones they held first. Exit 0 (also when it was not paused), 1 error."""
        producer, resolved = _producer(stream, group, url, partitions, "streamwork resume")
        with redis_errors(resolved, "streamwork resume"):
            try:
                was = producer.resume(stream, group)
            finally:
                producer.close()
        click.echo(f"{stream}/{group}: " + ("resumed" if was else "was not paused"))

    for command in (pause, resume):
        if command.name not in main.commands:
            main.add_command(command)
