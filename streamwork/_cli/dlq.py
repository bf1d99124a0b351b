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
from typing import Any, Final

import click
import redis
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from streamwork._cli.common import (
    check_recorded_partitions,
    detect_partitions,
    fail,
    partition_options,
    partition_streams,
    refused,
    url_option,
)
from streamwork._ops import deadletter
from streamwork._ops.format import fmt_when
from streamwork._redis import connection
from streamwork._wire.keys import StreamKeys
from streamwork.errors import StreamNotFound, StreamworkError


@click.group()
def dlq() -> None:
    """Inspect, replay and purge a stream's dead letters."""


#: characters of a dead letter's error (its type and the first line of its message) shown
ERROR_CHARS: Final = 300
#: the narrowest error column the table may have; a console too narrow for the table with
#: it (80 columns, a pipe) gets one block of labelled lines per dead letter instead, whose
#: values wrap and are never cut
ERROR_MIN_WIDTH: Final = 30

_COLUMNS: Final = ("id", "group", "key", "reason", "error", "attempts", "died", "source id")
#: ids, counts and times never wrap (nor get cut: the table is used only when they fit)
_NO_WRAP: Final = frozenset({"partition", "id", "attempts", "died", "source id"})
_MIN_WIDTH: Final = {"error": ERROR_MIN_WIDTH, "reason": 12}

#: a dead letter as listed: its partition (None: the stream is not partitioned) and itself
Listed = tuple[int | None, deadletter.DeadLetterEntry]


def _error(e: deadletter.DeadLetterEntry) -> str:
    """The error type and the first line of its message (the traceback is in --json)."""
    lines = e.detail.splitlines()
    text = f"{e.error_type}: {lines[0]}" if lines else e.error_type
    if len(text) > ERROR_CHARS:
        text = f"{text[:ERROR_CHARS]}… ({len(text) - ERROR_CHARS} more characters in --json)"
    return text


def _cells(e: deadletter.DeadLetterEntry) -> list[str]:
    """One dead letter's values, in the order of _COLUMNS."""
    return [e.id, e.group or "?", e.key or "?", e.reason, _error(e), str(e.attempts),
            fmt_when(e.ts_ms / 1000), e.src_id]


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, no_wrap=col in _NO_WRAP, overflow="fold",
                         min_width=_MIN_WIDTH.get(col),
                         justify="right" if col in ("partition", "attempts") else "left")
    for cells in rows:
        table.add_row(*(Text(v) for v in cells))  # Text: no markup in values
    return table


def _table_width(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> int:
    """The narrowest the table can be with nothing cut or split inside a word: no-wrap
    columns as wide as their widest cell, the others as their longest word (at least
    their minimum width), one space of padding each side and the rules between."""
    need = len(columns) + 1
    for i, col in enumerate(columns):
        cells = [col, *(row[i] for row in rows)]
        if col in _NO_WRAP:
            width = max(cell_len(c) for c in cells)
        else:
            width = max([_MIN_WIDTH.get(col, 0)]
                        + [cell_len(word) for c in cells for word in c.split()])
        need += width + 2
    return need


def _stacked(console: Console, title: str, rows: Sequence[Listed]) -> list[Text]:
    """The dead letters as blocks of lines: the id, then one labelled line per field, a
    long value wrapping (at spaces, else folded) under its label's value column."""
    label = max(len(c) for c in ("partition", *_COLUMNS)) + 4  # "  name  " then the value
    width = max(console.width - label, 20)
    out = [Text(title, style="bold")]
    for partition, e in rows:
        named = list(zip(_COLUMNS, _cells(e), strict=True))
        if partition is not None:
            named.insert(1, ("partition", str(partition)))
        out += [Text(""), Text(e.id, style="bold")]
        for name, value in named[1:]:
            lines = Text(value).wrap(console, width, overflow="fold") or [Text("")]
            for i, line in enumerate(lines):
                line.rstrip()
                head = f"  {name:<{label - 4}}  " if i == 0 else " " * label
                out.append(Text.assemble((head, "dim"), line))
    return out


def _show(title: str, rows: Sequence[Listed], partitioned: bool) -> None:
    """Print the dead letters as a table when the console is wide enough for it with
    nothing cut (ids and times whole, the error column ERROR_MIN_WIDTH wide at least),
    else stacked."""
    console = Console()
    columns = ("partition", *_COLUMNS) if partitioned else _COLUMNS
    cells = [([] if partition is None else [str(partition)]) + _cells(e)
             for partition, e in rows]
    if _table_width(columns, cells) <= console.width:
        console.print(_table(title, columns, cells))
        return
    for line in _stacked(console, title, rows):
        console.print(line, overflow="ignore", crop=False, soft_wrap=True)


def _which(stream: str, picked: Sequence[tuple[int, str]], partitions: int) -> str:
    """How a message names what was looked at: the stream, its partitions or one of them."""
    if partitions == 1:
        return stream
    if len(picked) == 1:
        i, name = picked[0]
        return f"{stream}, partition {i} ({name})"
    return f"{stream}, all {partitions} partitions"


_JSON_HELP: Final = """With --json, one JSON object per line, every value kept exactly:

\b
  {"id": "1712345678901-0",           the dead letter's entry id
   "partition": 2, "stream": "S#2.4",  (with --partitions only)
   "reason": "max_deliveries", "error_type": "ValueError",
   "detail": "the message, then the traceback",
   "src_id": "...", "attempts": 5, "consumer": "...", "group": "billing",
   "ts_ms": 1712345678901,             when it died, Unix ms
   "key": "order-7",                   null if the body does not decode
   "payload": {...},                   the decoded payload (null: as key)
   "original": {"d": ..., "a": ...}}   the job entry's fields, byte for byte

Each value in "original" is a string when its bytes are valid UTF-8, else
{"base64": "..."} (a field name that is not UTF-8: "base64:<its bytes>"). In
"payload", MessagePack bytes are always {"base64": "..."} (strings stay strings),
a map whose keys are not all strings is {"map": [[key, value], ...]} and NaN or
infinity is {"float": "nan"}; an object whose only key is base64, map or float is
always one of these markers (a payload map that looks like one comes as "map")."""


def _check_exists(client: Any, stream: str, picked: Sequence[tuple[int, str]]) -> None:
    """Fail (exit 1, as `streamwork job` does) when neither ``stream`` (nor any partition
    of it looked at), nor its dead-letter stream, nor its recorded partition count exists:
    a misspelt name or the wrong server, not "0 dead letters". One EXISTS."""
    keys = [k for _, name in picked for k in (name, StreamKeys.for_stream(name).dead)]
    keys.append(StreamKeys.for_stream(stream).partitions)
    if not client.exists(*keys):
        fail(str(StreamNotFound(stream)))


@dlq.command("list", epilog=_JSON_HELP)
@click.argument("stream")
@click.option("--count", default=50, show_default=True,
              help="how many dead letters to show, the oldest first")
@click.option("--json", "as_json", is_flag=True,
              help="one JSON object per line, values kept exactly (see below)")
@partition_options
@url_option
def dlq_list(stream: str, count: int, as_json: bool, partitions: int | None, partition: int | None,
             url: str | None) -> None:
    """Show the oldest dead letters of STREAM (of all its partitions with --partitions,
    merged oldest first, each with its partition): a table on a wide console, one block
    of lines per dead letter on a narrow one or a pipe."""
    partitions = detect_partitions(url, stream, partitions)
    picked = partition_streams(stream, partitions, partition)
    client = connection.sync_client(connection.resolve_url(url))
    check_recorded_partitions(client, stream, partitions)
    _check_exists(client, stream, picked)
    if partitions == 1:
        entries = deadletter.list_dead(client, stream, count)
        shown: Sequence[Any] = entries
        rows: list[Listed] = [(None, e) for e in entries]
        title = f"dead letters of {stream} ({len(entries)} shown)"
    else:
        merged = deadletter.list_dead_partitions(client, picked, count)
        shown, rows = merged, [(d.partition, d.entry) for d in merged]
        title = f"dead letters of {_which(stream, picked, partitions)} ({len(merged)} shown)"
    if as_json:
        for item in shown:
            click.echo(json.dumps(item.as_json()))
        return
    _show(title, rows, partitioned=partitions != 1)


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


def _why(exc: BaseException) -> str:
    """What stopped a replay: a refused permission in words that say what to grant, else
    the error as Redis gave it."""
    return (refused(exc) or f"{type(exc).__name__}: {exc}").rstrip(".")


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
    _check_exists(client, stream, picked)
    other = ", another group's" if group else ""
    if partitions == 1:
        try:
            replayed, skipped = deadletter.replay_dead(
                client, stream, list(ids) if ids else None, group=group)
        except StreamworkError as exc:
            fail(str(exc))
        except redis.RedisError as exc:
            fail(f"replay stopped: {_why(exc)}. Dead letters not yet replayed "
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
            fail(f"replay stopped in partition {i} ({names[i]}): {_why(exc)}. "
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
    _check_exists(client, stream, picked)
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
