"""``streamwork schedules STREAM``: a stream's periodic jobs, their last tick and next run.

Workers with ``schedules`` publish them to their group's hash ``{S}:schedules:<len(G)>:G``
(spec, time zone, catch_up, the last-tick key), every 30 s; this command reads that hash
and each schedule's last-tick key, so it needs none of the workers' code. The next run is
computed here from the spec (the first tick after now, on the Redis server's clock).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Final

import click
import redis
from rich.console import Console
from rich.table import Table

from streamwork._cli.common import detect_partitions, fail, redis_message, url_option
from streamwork._redis import connection
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names
from streamwork._wire.schedules import from_description, tick_text
from streamwork.errors import ConfigError, StreamworkError

__all__ = ["register", "schedules_of"]

#: a schedule nobody published for this long (s) has no live worker (they publish every 30 s)
STALE_AFTER: Final = 120.0


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _groups(client: Any, stream: str, partitions: int) -> list[str]:
    """The consumer groups of ``stream`` (of any of its partitions)."""
    pipe = client.pipeline(transaction=False)
    for name in partition_names(stream, partitions):
        pipe.xinfo_groups(name)
    found: set[str] = set()
    for reply in pipe.execute(raise_on_error=False):
        if not isinstance(reply, Exception):
            found.update(_text(g["name"]) for g in reply)
    return sorted(found)


def _when(ms: int | None, tz: str) -> str | None:
    """``ms`` as ISO 8601 in time zone ``tz`` (None stays None)."""
    if ms is None:
        return None
    try:
        from zoneinfo import ZoneInfo

        zone: dt.tzinfo = ZoneInfo(tz)
    except Exception:
        zone = dt.timezone.utc
    return dt.datetime.fromtimestamp(ms / 1000, zone).isoformat(timespec="milliseconds")


def schedules_of(client: Any, stream: str, groups: list[str] | None = None,
                 partitions: int = 1) -> list[dict[str, Any]]:
    """What the workers of ``stream`` published about their schedules (every group's, or
    those of ``groups``), with each one's last tick and next run; one dict per schedule."""
    wanted = groups if groups else _groups(client, stream, partitions)
    base = StreamKeys.for_stream(stream)
    seconds, micros = client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    rows: list[dict[str, Any]] = []
    for group in wanted:
        published = client.hgetall(base.group(group).schedules)
        for raw_name, raw in sorted(published.items()):
            name = _text(raw_name)
            try:
                desc = json.loads(raw)
            except ValueError:
                continue
            rows.append({"group": group, "name": name, **desc})
    pipe = client.pipeline(transaction=False)
    for row in rows:
        pipe.get(row["tick_key"])
    for row, last in zip(rows, pipe.execute() if rows else [], strict=True):
        row["last_tick_ms"] = int(last) if last is not None else None
        row["last_tick"] = tick_text(row["last_tick_ms"]) if last is not None else None
        try:
            nxt = from_description(row["name"], row).next_after(now)
        except (ConfigError, KeyError, ValueError, TypeError):  # e.g. no cronsim here
            nxt = row.get("next_ms")
        row.pop("next_ms", None)
        row["next_run_ms"] = nxt
        row["next_run"] = _when(nxt, str(row.get("tz", "UTC")))
        row["next_in_s"] = None if nxt is None else round((nxt - now) / 1000, 3)
        age = (now - int(row.get("updated_ms", 0))) / 1000
        row["published_s_ago"] = round(age, 1)
        row["stale"] = age > STALE_AFTER
    return rows


def _spec(row: dict[str, Any]) -> str:
    if row.get("kind") == "cron":
        tz = row.get("tz", "UTC")
        return f"cron {row.get('cron')}" + ("" if tz == "UTC" else f" ({tz})")
    return f"every {row.get('every'):g}s"


def _ago(seconds: float) -> str:
    return f"{seconds:.0f}s ago" + (" (stale: no live worker?)" if seconds > STALE_AFTER else "")


@click.command("schedules")
@click.argument("stream")
@click.option("--group", "groups", multiple=True,
              help="only this group's schedules (repeatable; default: every group's)")
@click.option("--json", "as_json", is_flag=True, help="a JSON list, one object per schedule")
@url_option
def schedules(stream: str, groups: tuple[str, ...], as_json: bool, url: str | None) -> None:
    """List the periodic jobs of STREAM's workers: spec, catch_up, last tick, next run."""
    try:
        StreamKeys.for_stream(stream)
        partitions = detect_partitions(url, stream, None)
        client = connection.sync_client(connection.resolve_url(url))
    except StreamworkError as exc:
        fail(str(exc))
    try:
        rows = schedules_of(client, stream, list(groups), partitions)
    except StreamworkError as exc:
        fail(str(exc))
    except redis.RedisError as exc:  # refused credentials, unreachable, wrong type, ...
        fail(redis_message(exc, connection.resolve_url(url),
                           f"cannot read the schedules of {stream!r}"))
    except Exception as exc:
        fail(f"cannot read the schedules of {stream!r}: {type(exc).__name__}: {exc}")
    finally:
        client.close()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no schedules published for {stream!r}: no worker with schedules has "
                   "run for it in the last 7 days")
        return
    table = Table(title=f"schedules of {stream}")
    for column in ("group", "schedule", "spec", "catch_up", "last tick (UTC)", "next run",
                   "in", "published"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["group"], row["name"], _spec(row), str(row.get("catch_up", "?")),
                      row["last_tick"] or "-", row["next_run"] or "never",
                      "-" if row["next_in_s"] is None else f"{row['next_in_s']:.1f}s",
                      _ago(row["published_s_ago"]))
    Console().print(table)


def register(main: click.Group) -> None:
    """Add the ``schedules`` command to ``main``."""
    main.add_command(schedules)
