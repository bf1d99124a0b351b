"""The scaling study's entry point: :func:`run_scaling` runs every section on one private
redis-server (the bench's own start-up, harness and measurements) and returns the result.

Sections: ``backlog`` (1), ``streams`` (2), ``payloads`` (3), ``processes`` (4), ``memory``
and ``soak`` (5), ``trimmer`` (6), and ``ops`` (the dashboard page and ``streamwork
inspect`` at many streams, from ``benchmarks/scenarios/ops_scale.py`` when it is there:
see :func:`ops_scale_hook`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import os
import time
from collections.abc import Callable
from typing import Any, Final

from benchmarks.harness import Harness
from benchmarks.measure import Params
from benchmarks.run import _machine, private_server
from benchmarks.scaling import load, memory, procs
from benchmarks.scaling.sizes import BATCH_SIZE, CONCURRENCY, ScalingSizes

#: where the dashboard / inspect scaling scenario lives (written beside this study)
OPS_SCALE_MODULE: Final = "benchmarks.scenarios.ops_scale"

SECTIONS: Final = ("backlog", "streams", "payloads", "processes", "memory", "soak",
                   "trimmer", "ops")


def ops_scale_hook(stream_counts: list[int], url: str, say: Callable[[str], None]
                   ) -> dict[str, Any]:
    """The dashboard page and ``streamwork inspect`` at many streams: calls
    ``ops_scale.run(stream_counts, url)`` when that module exists, else says it is absent."""
    try:
        module = importlib.import_module(OPS_SCALE_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != OPS_SCALE_MODULE:
            raise
        say(f"ops: {OPS_SCALE_MODULE} is not in this tree; section not run")
        return {"status": "absent", "module": OPS_SCALE_MODULE}
    got = module.run(stream_counts, url=url)
    return {"status": "ran", "module": OPS_SCALE_MODULE, "result": got}


def run_scaling(sizes: ScalingSizes, say: Callable[[str], None] = lambda _: None,
                url: str | None = None) -> dict[str, Any]:
    """Every section of the scaling study, on a private redis-server (or ``url``, a
    loopback Redis it may FLUSHALL)."""
    started = time.time()
    with private_server(url) as (server_url, port):
        h = Harness(server_url, port, Params.make(quick=sizes.quick, repeats=1), say)
        try:
            result: dict[str, Any] = {
                "date": dt.date.today().isoformat(), "machine": _machine(h.r),
                "sizes": dataclasses.asdict(sizes),
                "worker": {"concurrency": CONCURRENCY, "batch_size": BATCH_SIZE}}
            sections: dict[str, Callable[[], Any]] = {
                "backlog": lambda: load.backlog(h, sizes, say),
                "streams": lambda: load.streams(h, sizes, say),
                "payloads": lambda: load.payloads(h, sizes, say),
                "processes": lambda: procs.processes(h, sizes, say),
                "memory": lambda: memory.memory(h, sizes, say),
                "soak": lambda: {mode: procs.soak(h, sizes, mode == "dedup_on", say)
                                 for mode in ("dedup_off", "dedup_on")},
                "trimmer": lambda: memory.trimmer(h, sizes, say),
                "ops": lambda: ops_scale_hook(list(sizes.ops_stream_counts), server_url, say),
            }
            seconds: dict[str, float] = {}
            for name in SECTIONS:
                t = time.time()
                say(f"-- {name}")
                h.r.flushall()
                result[name] = sections[name]()
                seconds[name] = round(time.time() - t, 1)
        finally:
            h.close()
    result["section_seconds"] = seconds
    result["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["seconds"] = round(time.time() - started, 1)
    return result
