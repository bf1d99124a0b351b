"""Per-job expiry (``send(..., expires=...)``): a job whose delivery has not started by its
``expires`` time is not run. It ends ``expired``: acknowledged, its record says so (with
job records), counted as ``expired``, and neither its staged writes nor its chained sends
happen, since its handler never ran. Each delivery is checked as its start is decided, a
retry's too: a retry that falls due after the job expired is dropped the same way."""

from __future__ import annotations

import time
from typing import Final

from streamwork._worker.core.delivery import Delivery
from streamwork._worker.core.seam import GO, Drop, Feature, Parts, Verdict

STATE: Final = "expired"  #: the state an expired job ends in (its record, its status)


class Expiry(Feature):
    """Drops deliveries past their job's ``expires`` before they start."""

    @classmethod
    def build(cls, parts: Parts) -> Expiry:
        return cls()

    def check_start(self, d: Delivery) -> Verdict:
        options = d.msg.options
        if not options:  # most jobs carry no option at all
            return GO
        until = options.get("expires")
        if until is None or time.time() < until.timestamp():
            return GO
        return Drop(STATE, f"not started before it expired at {until.isoformat()}")
