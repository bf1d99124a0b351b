"""``streamwork bench``: runs the benchmark harness of a source checkout.

The harness is the top-level ``benchmarks`` package, outside the library (``python -m
benchmarks`` is the same command). It is imported only when ``bench`` runs, so ``import
streamwork`` and ``streamwork --help`` never load it. An installed wheel has no
``benchmarks`` package; the command then says to run it from a source checkout.
"""

from __future__ import annotations

import importlib
from typing import Final

import click

__all__ = ["register"]

#: the module of the harness's click command, in a source checkout
_HARNESS: Final = "benchmarks.cli"


def _harness_command() -> click.Command:
    """The harness's ``bench`` command; a click error when no source checkout is importable."""
    try:
        module = importlib.import_module(_HARNESS)
    except ModuleNotFoundError as exc:
        if exc.name not in ("benchmarks", _HARNESS):
            raise  # the harness is there but one of its own imports failed: show that
        raise click.ClickException(
            "the benchmark harness is not installed: it is the top-level `benchmarks` "
            "package of a source checkout, which this installation does not include. Run "
            "it from a source checkout instead: `python -m benchmarks` (same options)."
        ) from None
    command: click.Command = module.bench_command
    return command


@click.command("bench", add_help_option=False,
               context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Benchmark streamwork against raw redis-py on a private redis-server."""
    command = _harness_command()
    # parse the arguments with the harness's own options, as if it were registered here
    with command.make_context(ctx.info_name, list(ctx.args), parent=ctx.parent) as sub:
        command.invoke(sub)


def register(main: click.Group) -> None:
    """Add the ``bench`` command to the ``streamwork`` CLI group."""
    main.add_command(bench)
