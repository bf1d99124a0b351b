"""Looks at a server that a fault test may have taken down."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis


def safe(fn: Callable[[], Any]) -> Any:
    """``fn()``, a look at a server that may be down or loading right now; False while it
    is (a check to wait on, not to fail)."""
    try:
        return fn()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
            redis.exceptions.BusyLoadingError):
        return False
