"""End reports: a write a feature wants made with a job's end, whatever that end is (done,
dead, cancelled, ended without running), in the same atomic step that records it (the
scripts' ``end_report``, join_lib.lua). A feature hangs an `EndReport` on a delivery
(``d.ends``) when it is admitted; the core hands each ending script the reports of the
deliveries it ends, with the keys they touch. A retry is no end: nothing is reported."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from streamwork._worker.core.delivery import Delivery


class EndReport(Protocol):
    """What to write when a delivery's job ends."""

    #: the keys the report writes (the script gets them in KEYS)
    keys: tuple[str, ...]

    def spec(self, first_key: int, done: bytes) -> bytes:
        """The report as the script reads it: its keys are KEYS[first_key..]; ``done``
        is what a success reports (`done_value`), b"" for any other end."""
        ...

    def done_value(self, result: Any, pack: Callable[[Any], bytes]) -> bytes:
        """What a success reports, from the handler's ``result`` (``pack``: the worker's
        MessagePack packer, with its codec)."""
        ...


def end_specs(ds: Sequence[Delivery | Any], keys: list[str | bytes], first_key: int,
              pack: Callable[[Any], bytes] | None = None) -> list[bytes | str] | None:
    """One report per delivery (or failure: its ``ends``; "" for none) for a script
    whose KEYS[first_key..] are ``keys``, which this extends with the reports' keys; None
    when none has one. With ``pack`` the deliveries succeeded (their results are
    reported)."""
    reports: list[EndReport | None] = [getattr(d, "ends", None) for d in ds]
    if not any(r is not None for r in reports):
        return None
    specs: list[bytes | str] = []
    for d, report in zip(ds, reports, strict=True):
        if report is None:
            specs.append("")
            continue
        first = first_key + len(keys)
        keys.extend(report.keys)
        done = b"" if pack is None else report.done_value(d.result, pack)
        specs.append(report.spec(first, done))
    return specs


def with_reports(columns: list[list[Any]], ds: Sequence[Any], keys: list[str | bytes],
                 first_key: int, at: int, pack: Callable[[Any], bytes] | None = None
                 ) -> bool:
    """Add ``ds``'s end reports to a script's MessagePack ``columns`` as column ``at`` (the
    columns before it padded with empty ones), their keys to ``keys`` (KEYS[first_key..]);
    whether there was any (`end_specs`)."""
    reports = end_specs(ds, keys, first_key, pack)
    if reports is None:
        return False
    columns += [[] for _ in range(at - len(columns))]
    columns.append(reports)
    return True


def with_row_reports(rows: list[list[Any]], ds: Sequence[Any], keys: list[str | bytes],
                     first_key: int) -> None:
    """Append each end report to its failure's row (fail.lua's last field), if any."""
    reports = end_specs(ds, keys, first_key)
    if reports is not None:
        for row, spec in zip(rows, reports, strict=True):
            row.append(spec)


def claim_columns(batch: Sequence[Delivery], starts: Sequence[int] | None,
                  report_keys: list[str | bytes]) -> list[list[Any]]:
    """claim.lua's: the deliveries, their starts (1: taken as running at once) and end
    reports (their keys into ``report_keys``: KEYS[4..])."""
    columns: list[list[Any]] = [
        [d.entry_id for d in batch], [d.src for d in batch], [d.msg.key for d in batch],
        [d.msg.attempt for d in batch], [d.lease_id for d in batch],
        [0] * len(batch) if starts is None else list(starts)]
    with_reports(columns, batch, report_keys, 4, 6)
    return columns
