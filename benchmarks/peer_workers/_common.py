"""What every peer program shares: its arguments and the start line it prints."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import sys
import time
from collections.abc import Sequence


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--counter", default="peers:handled")
    args = p.parse_args(argv)
    # no per-job log lines (arq and rq log each job at INFO): every program is quiet alike
    logging.basicConfig(level=logging.WARNING)
    return args


def versions(*dists: str) -> dict[str, str]:
    out = {}
    for name in dists:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "?"
    return out


def started(config: str, *dists: str) -> None:
    """Tell the harness the worker starts now (``time.monotonic()``: system-wide on Linux)."""
    line = {"event": "start", "t": time.monotonic(), "config": config,
            "versions": versions(*dists)}
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()
