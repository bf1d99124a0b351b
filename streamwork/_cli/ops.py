"""``streamwork inspect``, ``streamwork top``, ``streamwork job`` and ``streamwork cancel``:
what operators look at, and cancelling a job.

``register(main)`` adds the commands to the ``streamwork`` click group; their bodies are
:mod:`streamwork._cli.inspect`, :mod:`streamwork._cli.top` and :mod:`streamwork._cli.job`.
The figures come from :mod:`streamwork._ops.stats`; docs/guides/operations.md says what
they mean.

``--partitions P`` reads a partitioned stream's P partitions and shows their sums, plus a
table per partition (with the worker owning it in ordered mode and, on a Cluster, the node
serving it); ``--partition N`` looks at partition N alone. ``job --partitions P`` finds the
job's record in whichever partition holds it.
"""

from __future__ import annotations

import click

from streamwork._cli.common import partition_options, url_option
from streamwork._cli.inspect import inspect_command
from streamwork._cli.job import cancel_command, job_command
from streamwork._cli.top import top_command
from streamwork._ops.thresholds import Threshold, parse_threshold

__all__ = ["register"]


def _thresholds(ctx: click.Context, param: click.Parameter,
                values: tuple[str, ...]) -> tuple[Threshold, ...]:
    """The ``--fail-if`` expressions parsed; a bad one is a usage error (exit 2)."""
    try:
        return tuple(parse_threshold(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def register(main: click.Group) -> None:
    """Add ``inspect``, ``top``, ``job`` and ``cancel`` to the ``streamwork`` command group
    (idempotent)."""
    @click.command("inspect")
    @click.argument("stream", required=False)
    @click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables")
    @click.option("--fail-if", "fail_if", multiple=True, callback=_thresholds,
                  metavar="EXPR",
                  help="exit 2 with a FAIL line on stderr when crossed, e.g. 'lag>10000', "
                       "'dead>0', 'pending>=500', 'oldest-pending>300', 'delayed>1000', "
                       "'delayed-due>0' (repeatable; quote it)")
    @click.option("--quiet", "-q", is_flag=True,
                  help="no tables (JSON on one line): only FAIL/WARN lines and the exit code")
    @partition_options
    @url_option
    def inspect(stream: str | None, as_json: bool, fail_if: tuple[Threshold, ...],
                quiet: bool, partitions: int | None, partition: int | None,
                url: str | None) -> None:
        """Groups, consumers, lag, pending (count, oldest age), delayed and dead letters of
        STREAM, or of every stream when none is given (one line each when there are more
        than 50); a partitioned stream's totals and each partition with --partitions P. A
        group's lag counts what will reach it
        without a new send: unread entries of the stream and of its retry stream (replayed
        dead letters, retries) and its due retries. Exit 0 OK, 1 error, 2 --fail-if hit."""
        inspect_command(stream, as_json, fail_if, quiet, url, partitions, partition)

    @click.command("top")
    @click.argument("stream", required=False)
    @click.option("--interval", type=click.FloatRange(min=0.1), default=1.0,
                  show_default=True, help="seconds between refreshes (and rate windows)")
    @click.option("--once", is_flag=True,
                  help="take two samples --interval apart, print one frame and exit")
    @partition_options
    @url_option
    def top(stream: str | None, interval: float, once: bool, partitions: int | None,
            partition: int | None, url: str | None) -> None:
        """Live view of every stream (or STREAM): inspect's figures plus produced/s and
        acked/s (partitioned streams as totals and per partition with --partitions P).
        On a terminal it redraws in place; into a pipe or a file (`top | tee top.log`)
        it prints a plain frame every --interval. Ctrl-C quits."""
        top_command(stream, interval, once, url, partitions, partition)

    @click.command("job")
    @click.argument("stream")
    @click.argument("key")
    @click.option("--group", default=None,
                  help="consumer group (may be left out when the stream has only one)")
    @click.option("--json", "as_json", is_flag=True, help="print the status as one JSON object")
    @partition_options
    @url_option
    def job(stream: str, key: str, group: str | None, as_json: bool, partitions: int | None,
            partition: int | None, url: str | None) -> None:
        """Show what GROUP knows of job KEY: running, waiting, done (with its result), dead
        (with reason and dead-letter id) or unknown; with --partitions P, from whichever
        partition holds it (and which one that is)."""
        job_command(stream, key, group, as_json, url, partitions, partition)

    @click.command("cancel")
    @click.argument("stream")
    @click.argument("key")
    @click.option("--group", default=None,
                  help="consumer group (may be left out when the stream has only one)")
    @click.option("--reason", default="", help="why; kept in the job's status")
    @click.option("--order-key", default=None,
                  help="the order key the job was sent with, if not its key (partitioned)")
    @partition_options
    @url_option
    def cancel(stream: str, key: str, group: str | None, reason: str,
               order_key: str | None, partitions: int | None, partition: int | None,
               url: str | None) -> None:
        """Cancel job KEY for GROUP: queued, delayed or waiting, it will not run; running,
        its handler sees msg.cancelled; done, nothing changes. Prints the state it was in.
        Needs dedup on the workers (the default)."""
        cancel_command(stream, key, group, reason, order_key, url, partitions)

    for command in (inspect, top, job, cancel):
        if command.name not in main.commands:
            main.add_command(command)
