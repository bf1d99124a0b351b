"""What every ``streamwork`` subcommand shares: the ``--url`` option, the partition options
(``--partitions P``, ``--partition N``) and failing with a clear message instead of a
traceback."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final, NoReturn, TypeVar

import click
import redis

from streamwork._hosting.processes import SUPERVISOR_ENV
from streamwork._ops.partitioned import recorded_partitions
from streamwork._redis import acl, connection
from streamwork._text import credentials_hint, redact_url
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import MAX_PARTITIONS, partition_names
from streamwork.errors import ConfigError, RedisUnavailable, StreamworkError

F = TypeVar("F", bound=Callable[..., Any])

#: environment variable read for ``--partitions`` when the option is not given
PARTITIONS_ENV: Final = "STREAMWORK_PARTITIONS"

#: ``ctx.meta`` entry (shared by a command's context and its parents'): the context of the
#: command that takes ``--url``, so a refused permission met anywhere in it can name the
#: user and the stream (`refused`)
_COMMAND: Final = "streamwork.command"
#: ``ctx.meta`` key of the URL a command talks to (resolved), for `Main`'s error lines
URL_META: Final = "streamwork.url"


def _check_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """The URL (or $REDIS_URL) checked before the command starts: a malformed one is a
    usage error saying what to fix, not a traceback. Unless it was given with --url, one
    line on stderr names the server (password masked) and where its URL came from, so a
    forgotten $REDIS_URL is not a silent talk with whatever answers on the default."""
    try:
        resolved = connection.resolve_url(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None
    ctx.meta[_COMMAND] = ctx
    ctx.meta[URL_META] = resolved
    source = connection.url_source(value)
    if source != "--url" and SUPERVISOR_ENV not in os.environ:  # said once, not per child
        why = ("the default: neither --url nor $REDIS_URL is set" if source == "default"
               else "from $REDIS_URL")
        click.echo(f"streamwork: Redis at {redact_url(resolved)} ({why})", err=True)
    return value


def refused(exc: BaseException) -> str | None:
    """The message for a permission Redis refused the command's ACL user (naming the
    command or the stream's keys, and what to grant), or None for any other error."""
    ctx = click.get_current_context(silent=True)
    command = ctx.meta.get(_COMMAND, ctx) if ctx is not None else None
    params = command.params if command is not None else {}
    stream, url = params.get("stream"), params.get("url")
    try:
        resolved = connection.resolve_url(url if isinstance(url, str) else None)
    except ConfigError:
        resolved = ""
    better = acl.explain(exc, resolved, stream=stream if isinstance(stream, str) else None)
    return None if better is None else str(better)


url_option = click.option(
    "--url", default=None, callback=_check_url,
    help="Redis URL (default: $REDIS_URL, else redis://127.0.0.1:6379/0; also "
         "redis+cluster://host:port and redis+sentinel://host:port,.../service[/db]).",
)


def fail(message: str) -> NoReturn:
    """Stop the command with ``message`` on stderr and exit status 1."""
    raise click.ClickException(message)


def redis_message(exc: redis.RedisError, url: str | None, what: str) -> str:
    """One line for a Redis error a command met (the URL's password masked): credentials
    refused and what to put in the URL, the server unreachable, or its error reply."""
    where = redact_url(url) if url else "the server"
    hint = credentials_hint(exc)
    if hint:
        return f"{what}: Redis at {where} refused the connection: {hint} (it said: {exc})"
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return str(RedisUnavailable(what, url or "the server", exc))
    return f"Redis at {where} answered with an error: {exc}"


class Main(click.Group):
    """The ``streamwork`` group: a Redis or streamwork error that a command did not turn
    into its own message ends it with one line (exit 1), never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StreamworkError as exc:
            raise click.ClickException(str(exc)) from None
        except redis.RedisError as exc:
            denied = refused(exc)  # a permission the ACL user lacks: what to grant
            if denied is not None:
                raise click.ClickException(denied) from None
            what = f"streamwork {ctx.invoked_subcommand or ''}".rstrip()
            raise click.ClickException(redis_message(exc, ctx.meta.get(URL_META), what)) \
                from None


def _check_partitions(ctx: click.Context, param: click.Parameter,
                      value: int | None) -> int | None:
    if value is not None and not 1 <= value <= MAX_PARTITIONS:
        raise click.BadParameter(
            f"{value} is not a partition count: give how many partitions the stream is split "
            f"into (1 to {MAX_PARTITIONS}, the partitions= of its producers and workers), or "
            f"leave --partitions out (and ${PARTITIONS_ENV} unset) for a stream that is not "
            "partitioned")
    return value


def _check_partition(ctx: click.Context, param: click.Parameter,
                     value: int | None) -> int | None:
    if value is not None and value < 0:
        raise click.BadParameter(
            f"{value} is not a partition: partitions are numbered from 0 (0 to P-1 with "
            "--partitions P)")
    return value


def partition_options(fn: F) -> F:
    """Add ``--partitions P`` (default 1, or $STREAMWORK_PARTITIONS) and ``--partition N``."""
    fn = click.option(
        "--partition", "partition", type=int, default=None, metavar="N",
        callback=_check_partition,
        help="only partition N (0-based; needs --partitions greater than N)")(fn)
    return partitions_option(
        "the stream is split into P partitions (as its producers and workers were told): "
        "look at all of them together")(fn)


def partitions_option(what: str) -> Callable[[F], F]:
    """``--partitions P`` alone (default: the recorded count, else 1, or
    $STREAMWORK_PARTITIONS), its help ``what`` it does."""
    return click.option(
        "--partitions", "partitions", type=int, default=None, metavar="P",
        envvar=PARTITIONS_ENV, show_envvar=True, callback=_check_partitions,
        help=f"{what} [default: the count recorded in {{S}}:partitions, else 1]")


def detect_partitions(url: str | None, stream: str | None, given: int | None) -> int:
    """``--partitions`` as given, else the count the stream's first partitioned producer or
    worker recorded (``{S}:partitions``, one GET), else 1. Unreachable Redis or a name
    that cannot be partitioned: 1, and the command then reports what is wrong."""
    if given is not None:
        return given
    if stream is None:
        return 1
    try:
        key = StreamKeys.for_stream(stream).partitions
        client = connection.sync_client(connection.resolve_url(url))
    except Exception:
        return 1
    try:
        raw = client.get(key)
    except Exception:
        return 1
    finally:
        client.close()
    return int(raw) if raw is not None else 1


def chosen_partition(partitions: int, partition: int | None) -> int | None:
    """The one partition asked for (None: all of them), after checking that ``--partition``
    fits ``--partitions``; a click usage error (exit 2) that says what to do otherwise."""
    if partition is None:
        return None
    if partition >= partitions:
        if partitions == 1:
            hint = (f"give --partitions P as well (how many partitions the stream is split "
                    f"into, more than {partition}), or set ${PARTITIONS_ENV}")
        else:
            hint = (f"with --partitions {partitions} the partitions are numbered 0 to "
                    f"{partitions - 1}; pick one of those, or give the right --partitions")
        raise click.BadParameter(f"partition {partition} needs --partitions greater than "
                                 f"{partition}: {hint}",
                                 ctx=click.get_current_context(silent=True),
                                 param_hint="'--partition'")
    return partition


def partition_streams(stream: str, partitions: int,
                      partition: int | None) -> list[tuple[int, str]]:
    """``(number, stream name)`` of the partitions of ``stream`` a command looks at: every
    one, or just ``partition``. ``[(0, stream)]`` for a stream that is not partitioned."""
    chosen = chosen_partition(partitions, partition)
    try:
        names = partition_names(stream, partitions)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), ctx=click.get_current_context(silent=True),
                                 param_hint="'STREAM'") from None
    if chosen is not None:
        return [(chosen, names[chosen])]
    return list(enumerate(names))


def check_recorded_partitions(client: Any, stream: str, partitions: int) -> None:
    """With ``--partitions P`` (P > 1): fail (exit 1) when the stream's partition count, as
    its first partitioned producer or worker recorded it, is another one; one GET."""
    if partitions == 1:
        return
    recorded = recorded_partitions(client, stream)
    if recorded is not None and recorded != partitions:
        key = StreamKeys.for_stream(stream).partitions
        fail(f"stream {stream!r} is split into {recorded} partitions (recorded in {key!r}), "
             f"not {partitions}: give --partitions {recorded}")
