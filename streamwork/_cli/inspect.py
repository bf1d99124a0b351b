"""``streamwork inspect``: a stream's (or every stream's) figures as tables or JSON, and
``--fail-if`` thresholds checked against them. With no STREAM and more than
:data:`OVERVIEW_OVER` streams, the human view is one line per stream.

Exit codes: 0 fine, 1 error (Redis unreachable, no such stream), 2 a ``--fail-if``
threshold was crossed (click also uses 2 for a usage error, such as a bad ``--fail-if``
expression, so a misconfigured probe fails rather than passes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

import click

from streamwork._cli.common import detect_partitions
from streamwork._cli.render import render_inspect, render_overview
from streamwork._cli.views import checked_view, redis_errors, sample_view, wide_console
from streamwork._ops.stats import StreamStats
from streamwork._ops.thresholds import Threshold, check_thresholds
from streamwork._redis import connection
from streamwork._text import redact_url

__all__ = ["FAIL_EXIT_CODE", "OVERVIEW_OVER", "inspect_command", "missing_partitions"]

FAIL_EXIT_CODE: Final = 2  #: exit code of `inspect --fail-if` when a threshold is crossed
#: with no STREAM, more streams than this are shown one line each (not three tables each)
OVERVIEW_OVER: Final = 50


def inspect_command(stream: str | None, as_json: bool, fail_if: Sequence[Threshold],
                    quiet: bool, url: str | None, partitions: int | None = None,
                    partition: int | None = None) -> None:
    """Body of ``streamwork inspect`` (see ``register``)."""
    view = checked_view(stream, detect_partitions(url, stream, partitions), partition)
    resolved = connection.resolve_url(url)
    with redis_errors(resolved, "streamwork inspect"):
        client = connection.sync_client(resolved)
        try:
            samples = sample_view(client, view)
        finally:
            client.close()
    if as_json:
        doc: Any = (samples[0].as_json() if stream is not None
                    else [s.as_json() for s in samples])
        click.echo(json.dumps(doc, indent=None if quiet else 2))
    elif not quiet and stream is None and len(samples) > OVERVIEW_OVER:
        click.echo(render_overview(samples))
        click.echo(f"\n{len(samples):,} streams, one line each: `streamwork inspect STREAM` "
                   "shows a stream's groups and consumers, --json every figure of all")
    elif not quiet:
        console = wide_console()
        if not samples:
            console.print(f"no streams at {redact_url(resolved)}")
        for s in samples:
            console.print(render_inspect(s))
    failures, warnings = check_thresholds(samples, fail_if)
    for line in missing_partitions(samples) + warnings + failures:
        click.echo(line, err=True)
    if failures:
        click.get_current_context().exit(FAIL_EXIT_CODE)


def missing_partitions(samples: Sequence[StreamStats]) -> list[str]:
    """A WARN line per partitioned stream some of whose partitions have no stream: nothing
    was sent or read there yet, or --partitions is not the stream's partition count."""
    lines = []
    for s in samples:
        missing = [p for p in s.partitions if p.stats is None]
        if missing:
            which = ", ".join(f"{p.index} ({p.stream})" for p in missing)
            lines.append(f"WARN {s.stream}: no stream for partition {which} of "
                         f"{s.partition_count}: nothing sent or read there yet, or the stream "
                         f"is not split into {s.partition_count} (check --partitions)")
    return lines
