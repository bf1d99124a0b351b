"""Function workers (``@sw.worker``) the tests run as `streamwork run
tests.workers.function:NAME`; each returns what it did, read back with ``p.result``."""

from __future__ import annotations

import os
from typing import Any

import streamwork as sw

ECHO_STREAM = "fn-echo"
SHOUT_STREAM = "fn-shout"


@sw.worker(ECHO_STREAM, group="fn", read_block=0.05, drain_timeout=10.0)
async def echo(msg: sw.Message) -> dict[str, Any]:
    """Return the job's number and the pid of the process that ran it."""
    return {"n": msg.payload["n"], "pid": os.getpid()}


@sw.worker(SHOUT_STREAM, group="fn", read_block=0.05, drain_timeout=10.0)
def shout(msg: sw.Message) -> str:
    """A plain def (runs in the worker's thread pool): the payload, upper case."""
    return str(msg.payload).upper()


def not_a_worker(msg: sw.Message) -> None:
    """A function without the decorator: `streamwork run` says it needs one."""
