"""Optional packages some tests use when they are installed (and do without otherwise)."""

from __future__ import annotations

import importlib.util


def have_matplotlib() -> bool:
    """Whether matplotlib is importable (the benchmarks' --plot needs it)."""
    return importlib.util.find_spec("matplotlib") is not None
