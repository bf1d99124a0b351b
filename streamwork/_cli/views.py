"""What ``inspect``, ``top``, ``job`` and ``cancel`` share: a console wide enough for the
tables, Redis and streamwork errors as one line (exit 1), and which streams ``inspect`` and
``top`` look at (:class:`View`: one stream or all, and its partitions) and sampling them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click
import redis
from rich.console import Console

from streamwork._cli.common import (
    check_recorded_partitions,
    chosen_partition,
    partition_streams,
    redis_message,
    refused,
)
from streamwork._ops import partitioned, stats
from streamwork._ops.stats import StreamStats
from streamwork.errors import StreamworkError

__all__ = ["View", "checked_view", "redis_errors", "sample_view", "wide_console"]


def wide_console() -> Console:
    """The console, 160 columns wide when it is not a terminal (a pipe, a test)."""
    console = Console()
    if not console.is_terminal and console.width < 160:
        console = Console(width=160)  # piped or captured: do not squeeze the tables
    return console


@contextmanager
def redis_errors(url: str, what: str) -> Iterator[None]:
    """Turn Redis and streamwork errors into one clear line and exit code 1."""
    try:
        yield
    except StreamworkError as exc:
        raise click.ClickException(str(exc)) from None
    except redis.RedisError as exc:
        denied = refused(exc)
        if denied is not None:
            raise click.ClickException(f"{what}: {denied}") from None
        raise click.ClickException(redis_message(exc, url, what)) from None


@dataclass(frozen=True, slots=True)
class View:
    """What ``inspect``/``top`` look at: one stream or all, and its partitions."""

    stream: str | None
    partitions: int = 1
    partition: int | None = None


def checked_view(stream: str | None, partitions: int, partition: int | None) -> View:
    """The checked options (a click usage error, before any connection, when they do not
    fit together)."""
    chosen = chosen_partition(partitions, partition)
    if partitions == 1:
        return View(stream)
    if stream is None:
        if chosen is not None:
            raise click.UsageError("--partition N needs a STREAM: name the partitioned stream, "
                                   "e.g. `streamwork inspect orders --partitions 4 "
                                   "--partition 2`")
        return View(None, partitions)
    partition_streams(stream, partitions, chosen)  # checks the name suits partitioning
    return View(stream, partitions, chosen)


def sample_view(client: Any, view: View, first: bool = True) -> list[StreamStats]:
    """One sample of what ``view`` looks at (the first one checks the partition count
    recorded for a partitioned stream)."""
    if view.partitions > 1:
        if view.stream is not None:
            if first:
                check_recorded_partitions(client, view.stream, view.partitions)
            return [partitioned.partitioned_stats(client, view.stream, view.partitions,
                                                  view.partition)]
        return partitioned.sample_partitioned(client, view.partitions)
    if view.stream is not None:
        return [stats.stream_stats(client, view.stream)]
    return stats.sample(client)
