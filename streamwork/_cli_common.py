"""What every ``streamwork`` subcommand shares: the ``--url`` option and failing with a
clear message instead of a traceback."""

from __future__ import annotations

from typing import NoReturn

import click

url_option = click.option(
    "--url", default=None, help="Redis URL (default: $REDIS_URL, else redis://127.0.0.1:6379/0)."
)


def fail(message: str) -> NoReturn:
    """Stop the command with ``message`` on stderr and exit status 1."""
    raise click.ClickException(message)
