"""``streamwork send``: enqueue one job from the command line, with every job option.

The job options' flags are made from their declaration (`job_options.OPTIONS`): one
``--name`` per option (``order_key`` -> ``--order-key``), its help the option's, its value
turned from text by the option's type (``--at`` takes ISO 8601 with a zone) and checked by
the producer, so an option added there is a flag here without a line of this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from streamwork._cli.common import detect_partitions, fail, partitions_option, url_option
from streamwork._producer.batching import new_key
from streamwork._producer.shells import Producer
from streamwork._wire.job_options import OPTIONS, JobOption, from_text, type_name
from streamwork._wire.partitions import partition_names, partition_of
from streamwork.errors import StreamworkError

__all__ = ["register"]


class _OptionText(click.ParamType[Any]):
    """A job option's value from its text (`job_options.from_text`)."""

    def __init__(self, option: JobOption) -> None:
        self.option = option
        self.name = type_name(option)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return from_text(self.option, value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def flag(option: JobOption) -> str:
    """The command-line flag of a job option: ``order_key`` -> ``--order-key``."""
    return "--" + option.name.replace("_", "-")


def job_option_flags(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add one flag per job option; the command gets them all as ``job_options``."""
    for option in reversed(OPTIONS):
        kind: click.ParamType[Any] = (click.Choice(option.choices) if option.choices
                                 else _OptionText(option))
        fn = click.option(flag(option), option.name, type=kind, default=None,
                          help=option.help)(fn)
    return fn


def send(stream: str, payload: str, key: str | None, partitions: int | None,
         url: str | None, **options: Any) -> None:
    """Enqueue one job whose PAYLOAD is JSON; prints the entry id (or key, when delayed).
    To a partitioned stream, the partition it went to follows on stderr."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        fail(f"PAYLOAD is not valid JSON ({exc}); quote it, e.g. '{{\"order_id\": 7}}'")
    partitions = detect_partitions(url, stream, partitions)
    key = new_key() if key is None else key  # chosen here, to name its partition
    given = {name: value for name, value in options.items() if value is not None}
    try:
        with Producer.from_url(url, partitions={stream: partitions}) as producer:
            click.echo(producer.send(stream, data, key=key, **given))
    except StreamworkError as exc:
        fail(str(exc))
    if partitions > 1:
        order_key = given.get("order_key", key)
        i = partition_of(order_key, partitions)
        click.echo(f"partition {i} of {partitions} ({partition_names(stream, partitions)[i]})",
                   err=True)


def register(main: click.Group) -> None:
    """Add ``send`` to the ``streamwork`` command."""
    command = url_option(send)
    command = partitions_option("the stream is split into P partitions (as its producers and "
                                "workers were told): send to the one the order key picks")(command)
    command = job_option_flags(command)
    command = click.option("--key", default=None,
                           help="job key (identity for dedup); default a new uuid")(command)
    command = click.argument("payload")(command)
    command = click.argument("stream")(command)
    main.command(name="send")(command)
