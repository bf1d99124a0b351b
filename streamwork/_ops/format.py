"""How figures are written for people, the same on the command line and on the dashboard:
ages, counts, rates and times."""

from __future__ import annotations

import time

__all__ = ["fmt_age", "fmt_count", "fmt_rate", "fmt_when"]


def fmt_age(seconds: float | None) -> str:
    """``0.4s``, ``42s``, ``4m07s``, ``2h03m``, ``3d04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def fmt_count(value: int | None) -> str:
    """``12,345``; ``?`` for None (Redis could not tell)."""
    return "?" if value is None else f"{value:,}"


def fmt_rate(value: float | None) -> str:
    """A rate per second, ``1,234.5``; ``-`` for None (not computable yet)."""
    return "-" if value is None else f"{value:,.1f}"


def fmt_when(ts: float | None) -> str:
    """Unix seconds -> local ``YYYY-mm-dd HH:MM:SS``; ``-`` for None."""
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
