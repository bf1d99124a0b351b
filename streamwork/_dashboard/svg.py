"""Inline SVG sparklines for the dashboard, drawn on the server (no JavaScript, no images).

:func:`sparkline` turns a series of rates (None where a rate could not be computed) into
one small ``<svg>`` element. Its only text is numbers it formats itself and a title passed
through :func:`markupsafe.escape`, so it is safe to insert into a page unescaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from markupsafe import Markup, escape

__all__ = ["sparkline"]

WIDTH: Final = 160
HEIGHT: Final = 32
_PAD: Final = 2.0  #: px kept free at the top and bottom so a flat line stays visible


def _runs(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """Consecutive known values as runs of (index, value): a None breaks the line."""
    runs: list[list[tuple[int, float]]] = []
    current: list[tuple[int, float]] = []
    for i, v in enumerate(values):
        if v is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append((i, v))
    if current:
        runs.append(current)
    return runs


def sparkline(values: Sequence[float | None], title: str = "", *, capacity: int = 0,
              width: int = WIDTH, height: int = HEIGHT) -> Markup:
    """An ``<svg>`` line of ``values`` (oldest first) scaled to the largest one, the newest
    at the right edge; ``capacity`` points span the width (default: as many as given), so
    a window still filling up is drawn to its time scale. A single point is a dot; an
    empty or all-None series gives an empty frame."""
    top = max((v for v in values if v is not None), default=0.0)
    scale = (height - 2 * _PAD) / top if top > 0 else 0.0
    slots = max(capacity, len(values))
    step = width / max(slots - 1, 1)
    offset = slots - len(values)
    shapes = []
    for run in _runs(values):
        points = [((offset + i) * step, height - _PAD - v * scale) for i, v in run]
        if len(points) == 1:
            x, y = points[0]
            shapes.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="1.5"/>')
        else:
            coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            shapes.append(f'<polyline points="{coords}"/>')
    label = f"<title>{escape(title)}</title>" if title else ""
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">'
        f"{label}{''.join(shapes)}</svg>"
    )
