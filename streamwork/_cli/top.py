"""``streamwork top``: every stream's (or one stream's) figures and rates, redrawn every
``--interval`` on a terminal, or printed frame after frame into a pipe or a file."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from rich.console import Console, RenderableType
from rich.live import Live

from streamwork._cli.common import detect_partitions
from streamwork._cli.render import render_top
from streamwork._cli.views import checked_view, redis_errors, sample_view, wide_console
from streamwork._ops import stats
from streamwork._ops.rates import rates_between
from streamwork._ops.stats import StreamStats
from streamwork._redis import connection

__all__ = ["top_command"]


def top_command(stream: str | None, interval: float, once: bool, url: str | None,
                partitions: int | None = None, partition: int | None = None) -> None:
    """Body of ``streamwork top`` (see ``register``)."""
    view = checked_view(stream, detect_partitions(url, stream, partitions), partition)
    resolved = connection.resolve_url(url)
    console = wide_console()
    with redis_errors(resolved, "streamwork top"):
        client = connection.sync_client(resolved)
        try:
            before = sample_view(client, view)
            names = [s.stream for s in before]
            if once:
                time.sleep(interval)
                after = (sample_view(client, view, first=False) if view.partitions > 1
                         else stats.sample(client, names))
                console.print(_frame(before, after, interval))
                return
            def frames() -> Iterator[RenderableType]:
                """A frame now (without rates), then one per interval, forever."""
                nonlocal before
                yield _frame([], before, interval)
                while True:
                    time.sleep(interval)
                    after = (sample_view(client, view, first=False) if view.partitions > 1
                             else stats.sample(client, [stream] if stream else None))
                    yield _frame(before, after, interval)
                    before = after

            try:
                if console.is_terminal:
                    _redraw(console, frames())
                else:  # a pipe or a file: a live display would write nothing
                    _append(console, frames())
            except KeyboardInterrupt:
                pass
        finally:
            client.close()


def _redraw(console: Console, frames: Iterator[RenderableType]) -> None:
    """`top` on a terminal: each frame replaces the one before."""
    with Live(next(frames), console=console, auto_refresh=False,
              redirect_stdout=False) as live:
        for frame in frames:
            live.update(frame, refresh=True)


def _append(console: Console, frames: Iterator[RenderableType]) -> None:
    """`top` into a pipe or a file (`top | tee top.log`): the frames one after another,
    plain, each flushed when printed (a reader that went away, `top | head`, ends it:
    rich exits 1 on a broken pipe)."""
    for frame in frames:
        console.print(frame)
        console.print()
        console.file.flush()


def _frame(before: Sequence[StreamStats], after: Sequence[StreamStats],
           interval: float) -> RenderableType:
    """One frame: the ``after`` figures with their rates since ``before`` (none yet when
    ``before`` is empty)."""
    return render_top(after, rates_between(before, after), interval)
