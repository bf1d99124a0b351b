"""``streamwork dlq list|replay|purge``: a stream's dead letters, from the command line."""

from __future__ import annotations

import json
import time

import click
import redis
from rich.console import Console
from rich.table import Table

from . import _connection as connection
from . import _deadletter as deadletter
from ._cli_common import fail, url_option
from .errors import StreamworkError


@click.group()
def dlq() -> None:
    """Inspect, replay and purge a stream's dead letters."""


@dlq.command("list")
@click.argument("stream")
@click.option("--count", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line")
@url_option
def dlq_list(stream: str, count: int, as_json: bool, url: str | None) -> None:
    """Show the oldest dead letters of STREAM."""
    client = connection.sync_client(connection.resolve_url(url))
    entries = deadletter.list_dead(client, stream, count)
    if as_json:
        for e in entries:
            click.echo(json.dumps(e.as_json(), default=str))
        return
    table = Table(title=f"dead letters of {stream} ({len(entries)} shown)")
    for col in ("id", "group", "key", "reason", "error", "attempts", "died", "source id"):
        table.add_column(col)
    for e in entries:
        died = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.ts_ms / 1000))
        first_line = e.detail.splitlines()[0] if e.detail else ""
        table.add_row(e.id, e.group or "?", e.key or "?", e.reason,
                      f"{e.error_type}: {first_line}"[:60], str(e.attempts), died, e.src_id)
    Console().print(table)


@dlq.command("replay")
@click.argument("stream")
@click.option("--id", "ids", multiple=True, help="dead-letter id to replay (repeatable)")
@click.option("--all", "replay_all", is_flag=True, help="replay every dead letter")
@click.option("--group", default=None, help="only the dead letters of this consumer group")
@url_option
def dlq_replay(stream: str, ids: tuple[str, ...], replay_all: bool, group: str | None,
               url: str | None) -> None:
    """Hand dead letters of STREAM back, as fresh jobs (attempts start again), to the
    group each died in: other groups of the stream do not see them again."""
    if bool(ids) == replay_all:
        fail("say which dead letters: --id ID (repeatable) or --all")
    client = connection.sync_client(connection.resolve_url(url))
    try:
        replayed, skipped = deadletter.replay_dead(client, stream, list(ids) if ids else None,
                                                   group=group)
    except StreamworkError as exc:
        fail(str(exc))
    except redis.RedisError as exc:
        fail(f"replay stopped: {type(exc).__name__}: {exc}. Dead letters not yet replayed "
             "stay in the dead-letter stream; fix the cause and run the replay again.")
    other = ", another group's" if group else ""
    click.echo(f"replayed {replayed}, skipped {skipped} "
               f"(unknown id, no original fields{other})")


@dlq.command("purge")
@click.argument("stream")
@click.option("--older-than", type=float, default=None,
              help="only dead letters older than this many seconds")
@click.option("--id", "ids", multiple=True, help="dead-letter id to delete (repeatable)")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@url_option
def dlq_purge(stream: str, older_than: float | None, ids: tuple[str, ...], yes: bool,
              url: str | None) -> None:
    """Delete dead letters of STREAM for good (all, --older-than, or --id)."""
    what = (f"{len(ids)} dead letters" if ids else
            f"dead letters older than {older_than:g}s" if older_than is not None else
            "ALL dead letters")
    if not yes:
        click.confirm(f"Delete {what} of {stream}?", abort=True)
    client = connection.sync_client(connection.resolve_url(url))
    cutoff = None if older_than is None else int((time.time() - older_than) * 1000)
    n = deadletter.purge_dead(client, stream, older_than_ms=cutoff, ids=list(ids) or None)
    click.echo(f"deleted {n}")


def register(main: click.Group) -> None:
    """Add ``dlq`` to the ``streamwork`` command group."""
    main.add_command(dlq)
