"""One stream's figures summed over its groups, as the overviews show them (the
dashboard's stream list, ``streamwork inspect`` over many streams): the worst lag, all
pending deliveries, the oldest pending one."""

from __future__ import annotations

from streamwork._ops.stats import StreamStats

__all__ = ["oldest", "total_pending", "worst_lag"]


def worst_lag(s: StreamStats) -> int | None:
    """The largest lag of ``s``'s groups; None when a group's is unknown or it has none."""
    lags = [g.lag for g in s.groups]
    return None if not lags or None in lags else max(g.lag or 0 for g in s.groups)


def oldest(s: StreamStats) -> float | None:
    """Idle seconds of the oldest pending delivery over ``s``'s groups (None: none)."""
    return max((g.oldest_pending_age_s for g in s.groups
                if g.oldest_pending_age_s is not None), default=None)


def total_pending(s: StreamStats) -> int:
    """Deliveries ``s``'s groups hold, all together."""
    return sum(g.pending for g in s.groups)
