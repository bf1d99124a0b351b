"""The threshold language of ``streamwork inspect --fail-if``: ``METRIC>N`` or
``METRIC>=N`` over a stream's figures, parsed (:func:`parse_threshold`) and checked
against samples (:func:`check_thresholds`), one FAIL or WARN line per finding."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from streamwork._ops.stats import GroupStats, StreamStats

__all__ = ["GROUP_METRICS", "STREAM_METRICS", "Threshold", "check_thresholds",
           "parse_threshold"]

GROUP_METRICS: Final = ("lag", "pending", "oldest-pending")
STREAM_METRICS: Final = ("dead", "delayed", "delayed-due")
_EXPR: Final = re.compile(
    r"^\s*(?P<metric>[a-z-]+)\s*(?P<op>>=|>)\s*(?P<value>\d+(?:\.\d+)?)\s*$")
_FORMS: Final = (
    "use METRIC>N or METRIC>=N, METRIC one of lag, pending, oldest-pending (seconds), dead, "
    "delayed, delayed-due; e.g. --fail-if 'lag>10000' --fail-if 'oldest-pending>=300' "
    "(quote it: the shell takes a bare > for a redirection)"
)


@dataclass(frozen=True, slots=True)
class Threshold:
    """One ``--fail-if`` expression, e.g. ``lag>10000``."""

    metric: str
    op: str
    value: float

    def crossed(self, actual: float) -> bool:
        return actual >= self.value if self.op == ">=" else actual > self.value

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse_threshold(text: str) -> Threshold:
    """``'lag>10000'`` -> Threshold; raises ValueError naming the accepted forms."""
    m = _EXPR.match(text)
    if not m or m["metric"] not in GROUP_METRICS + STREAM_METRICS:
        raise ValueError(f"{text!r} is not a threshold: {_FORMS}")
    return Threshold(m["metric"], m["op"], float(m["value"]))


def _fmt_value(metric: str, value: float) -> str:
    if metric == "oldest-pending":
        return f"{value:.1f}s" if value != int(value) else f"{value:g}s"
    return f"{value:g}"


def _group_value(metric: str, g: GroupStats) -> float | None:
    if metric == "lag":
        return None if g.lag is None else float(g.lag)
    if metric == "pending":
        return float(g.pending)
    return g.oldest_pending_age_s or 0.0  # oldest-pending; nothing pending counts as 0


def _stream_value(metric: str, s: StreamStats) -> float:
    if metric == "dead":
        return float(s.dead)
    if metric == "delayed":
        return float(s.delayed_total)
    return float(s.delayed_due)


def check_thresholds(samples: Sequence[StreamStats],
                     thresholds: Sequence[Threshold]) -> tuple[list[str], list[str]]:
    """(failures, warnings): one line per crossed threshold and stream, naming the worst
    group for group figures (``FAIL orders/billing: lag 12000 > 10000``); a warning when
    Redis cannot tell a group's lag, which is then not checked."""
    failures: list[str] = []
    warnings: list[str] = []
    for s in samples:
        for t in thresholds:
            if t.metric in STREAM_METRICS:
                value = _stream_value(t.metric, s)
                if t.crossed(value):
                    failures.append(f"FAIL {s.stream}: {t.metric} {_fmt_value(t.metric, value)} "
                                    f"{t.op} {_fmt_value(t.metric, t.value)}")
                continue
            worst: tuple[float, str] | None = None
            for g in s.groups:
                gv = _group_value(t.metric, g)
                if gv is None:
                    warnings.append(f"WARN {s.stream}/{g.name}: Redis cannot tell this group's "
                                    f"lag; {t} not checked")
                elif worst is None or gv > worst[0]:
                    worst = (gv, g.name)
            if worst is not None and t.crossed(worst[0]):
                failures.append(f"FAIL {s.stream}/{worst[1]}: {t.metric} "
                                f"{_fmt_value(t.metric, worst[0])} {t.op} "
                                f"{_fmt_value(t.metric, t.value)}")
    return failures, warnings
