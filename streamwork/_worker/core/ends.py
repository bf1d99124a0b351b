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
