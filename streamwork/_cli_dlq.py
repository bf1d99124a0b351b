"""``streamwork dlq list|replay|purge``: a stream's dead letters, from the command line.

With ``--partitions P`` (a partitioned stream) every subcommand works on each partition's
own dead-letter stream: ``list`` merges them (oldest first, with the partition), ``replay``
hands each partition's dead letters back into that same partition's group retry stream,
``purge`` deletes per partition; ``--partition N`` limits any of them to partition N.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import click
import redis
from rich.console import Console
from rich.table import Table

from . import _connection as connection
from . import _deadletter as deadletter
from ._cli_common import (
    check_recorded_partitions,
    detect_partitions,
    fail,
    partition_options,
    partition_streams,
    url_option,
)
from .errors import StreamworkError


@click.group()
def dlq() -> None:
    """Inspect, replay and purge a stream's dead letters."""


def _died(ts_ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts_ms / 1000))


def _cells(e: deadletter.DeadLetterEntry) -> list[str]:
    first_line = e.detail.splitlines()[0] if e.detail else ""
    return [e.id, e.group or "?", e.key or "?", e.reason, f"{e.error_type}: {first_line}"[:60],
            str(e.attempts), _died(e.ts_ms), e.src_id]


_COLUMNS = ("id", "group", "key", "reason", "error", "attempts", "died", "source id")


def _which(stream: str, picked: Sequence[tuple[int, str]], partitions: int) -> str:
    """How a message names what was looked at: the stream, its partitions or one of them."""
    if partitions == 1:
        return stream
    if len(picked) == 1:
        i, name = picked[0]
        return f"{stream}, partition {i} ({name})"
    return f"{stream}, all {partitions} partitions"


@dlq.command("list")
@click.argument("stream")
@click.option("--count", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line")
@partition_options
@url_option
def dlq_list(stream: str, count: int, as_json: bool, partitions: int | None, partition: int | None,
             url: str | None) -> None:
    """Show the oldest dead letters of STREAM (of all its partitions with --partitions,
    merged oldest first, each with its partition)."""
    partitions = detect_partitions(url, stream, partitions)
    picked = partition_streams(stream, partitions, partition)
    client = connection.sync_client(connection.resolve_url(url))
    check_recorded_partitions(client, stream, partitions)
    if partitions == 1:
        entries = deadletter.list_dead(client, stream, count)
        if as_json:
            for e in entries:
                click.echo(json.dumps(e.as_json(), default=str))
            return
        table = Table(title=f"dead letters of {stream} ({len(entries)} shown)")
        for col in _COLUMNS:
            table.add_column(col)
        for e in entries:
            table.add_row(*_cells(e))
        Console().print(table)
        return
    merged = deadletter.list_dead_partitions(client, picked, count)
    if as_json:
        for d in merged:
            click.echo(json.dumps(d.as_json(), default=str))
        return
    table = Table(title=f"dead letters of {_which(stream, picked, partitions)} "
                        f"({len(merged)} shown)")
    for col in ("partition", *_COLUMNS):
        table.add_column(col)
    for d in merged:
        table.add_row(str(d.partition), *_cells(d.entry))
    Console().print(table)


def _located(client: Any, stream: str, picked: Sequence[tuple[int, str]],
             ids: Sequence[str]) -> tuple[dict[int, list[str]], int]:
    """The given dead-letter ids by the partition holding each (and how many none holds);
    fails, before anything changes, when an id is in several partitions."""
    names = dict(picked)
    numbers = {name: i for i, name in picked}
    where = deadletter.locate_dead(client, list(names.values()), ids)
    twice = {i: found for i, found in where.items() if len(found) > 1}
    if twice:
        entry_id, found = next(iter(twice.items()))
        fail(f"dead-letter id {entry_id} is in {len(found)} partitions of {stream} "
             f"({', '.join(str(numbers[n]) for n in found)}): say which with --partition N "
             "(the partition column of `streamwork dlq list`); nothing was changed")
    by_partition: dict[int, list[str]] = {}
    for entry_id, found in where.items():
        if found:
            by_partition.setdefault(numbers[found[0]], []).append(entry_id)
    return by_partition, sum(1 for found in where.values() if not found)


@dlq.command("replay")
@click.argument("stream")
@click.option("--id", "ids", multiple=True, help="dead-letter id to replay (repeatable)")
@click.option("--all", "replay_all", is_flag=True, help="replay every dead letter")
@click.option("--group", default=None, help="only the dead letters of this consumer group")
@partition_options
@url_option
def dlq_replay(stream: str, ids: tuple[str, ...], replay_all: bool, group: str | None,
               partitions: int | None, partition: int | None, url: str | None) -> None:
    """Hand dead letters of STREAM back, as fresh jobs (attempts start again), to the
    group each died in: other groups of the stream do not see them again. With
    --partitions, each partition's dead letters go back into that same partition."""
    if bool(ids) == replay_all:
        fail("say which dead letters: --id ID (repeatable) or --all")
    partitions = detect_partitions(url, stream, partitions)
    picked = partition_streams(stream, partitions, partition)
    client = connection.sync_client(connection.resolve_url(url))
    check_recorded_partitions(client, stream, partitions)
    other = ", another group's" if group else ""
    if partitions == 1:
        try:
            replayed, skipped = deadletter.replay_dead(
                client, stream, list(ids) if ids else None, group=group)
        except StreamworkError as exc:
            fail(str(exc))
        except redis.RedisError as exc:
            fail(f"replay stopped: {type(exc).__name__}: {exc}. Dead letters not yet replayed "
                 "stay in the dead-letter stream; fix the cause and run the replay again.")
        click.echo(f"replayed {replayed}, skipped {skipped} "
                   f"(unknown id, no original fields{other})")
        return
    names = dict(picked)
    try:
        if ids:
            todo, unknown = _located(client, stream, picked, ids)
        else:
            todo, unknown = {i: [] for i in names}, 0
    except redis.RedisError as exc:
        fail(f"cannot read the dead letters of {stream}: {type(exc).__name__}: {exc}")
    replayed, skipped = 0, unknown
    done: list[str] = []
    for i, wanted in todo.items():
        try:
            r, s = deadletter.replay_dead(client, names[i], wanted or None, group=group)
        except StreamworkError as exc:
            fail(str(exc))
        except redis.RedisError as exc:
            fail(f"replay stopped in partition {i} ({names[i]}): {type(exc).__name__}: {exc}. "
                 f"Partitions done: {', '.join(done) or 'none'}. Dead letters not yet replayed "
                 "stay in their partition's dead-letter stream; fix the cause and run the "
                 "replay again.")
        done.append(str(i))
        replayed, skipped = replayed + r, skipped + s
        click.echo(f"partition {i} ({names[i]}): replayed {r}, skipped {s}")
    click.echo(f"replayed {replayed}, skipped {skipped} "
               f"(unknown id, no original fields{other})")


@dlq.command("purge")
@click.argument("stream")
@click.option("--older-than", type=float, default=None,
              help="only dead letters older than this many seconds")
@click.option("--id", "ids", multiple=True, help="dead-letter id to delete (repeatable)")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@partition_options
@url_option
def dlq_purge(stream: str, older_than: float | None, ids: tuple[str, ...], yes: bool,
              partitions: int | None, partition: int | None, url: str | None) -> None:
    """Delete dead letters of STREAM for good (all, --older-than, or --id); of each of its
    partitions with --partitions."""
    partitions = detect_partitions(url, stream, partitions)
    picked = partition_streams(stream, partitions, partition)
    what = (f"{len(ids)} dead letters" if ids else
            f"dead letters older than {older_than:g}s" if older_than is not None else
            "ALL dead letters")
    client = connection.sync_client(connection.resolve_url(url))
    check_recorded_partitions(client, stream, partitions)
    if not yes:
        click.confirm(f"Delete {what} of {_which(stream, picked, partitions)}?", abort=True)
    cutoff = None if older_than is None else int((time.time() - older_than) * 1000)
    if partitions == 1:
        n = deadletter.purge_dead(client, stream, older_than_ms=cutoff, ids=list(ids) or None)
        click.echo(f"deleted {n}")
        return
    names = dict(picked)
    if ids:
        todo, _ = _located(client, stream, picked, ids)
        n = sum(deadletter.purge_dead(client, names[i], ids=found) for i, found in todo.items())
    else:
        n = sum(deadletter.purge_dead(client, name, older_than_ms=cutoff) for _, name in picked)
    click.echo(f"deleted {n}")


def register(main: click.Group) -> None:
    """Add ``dlq`` to the ``streamwork`` command group."""
    main.add_command(dlq)
