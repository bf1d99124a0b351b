"""Must NOT type-check (tests/test_job_options.py expects mypy to report each line)."""

from __future__ import annotations

import streamwork as sw


def produce(p: sw.Producer) -> None:
    p.send("orders", {}, timeout="5")  # error: a str is no number of seconds
    p.send("orders", {}, retries=3)  # error: not a job option
    p.send_many("orders", [{}], order_keys=[7])  # error: order keys are str
