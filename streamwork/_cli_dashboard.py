"""``streamwork dashboard``: the web UI's command (being built; registers nothing yet)."""

from __future__ import annotations

import click


def register(main: click.Group) -> None:
    """Add the ``dashboard`` command to ``main``."""
