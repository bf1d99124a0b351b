"""``streamwork demo``: runs the billing demo of ``examples/demo.py``.

The scenario lives in the examples, written with the public API only, so that what the
demo shows is also code to read; this module finds that file next to the package (a source
checkout, as ``make demo`` installs it) and runs it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import click

from streamwork.errors import StreamworkError

#: where the scenario is in a source checkout
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "demo.py"
_MODULE = "streamwork_examples_demo"


def load_example() -> ModuleType:
    """The module of ``examples/demo.py``, loaded once; StreamworkError when this
    installation has no examples directory (installed from a wheel)."""
    loaded = sys.modules.get(_MODULE)
    if loaded is not None:
        return loaded
    if not EXAMPLE.is_file():
        raise StreamworkError(
            f"the demo's scenario {EXAMPLE} is missing (streamwork was not installed from a "
            "source checkout): run `make demo` in a clone of the repository")
    spec = importlib.util.spec_from_file_location(_MODULE, EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_MODULE]
        raise
    return module


def run_demo(url: str, orders: int = 2000) -> Any:
    """Run the demo against ``url``, or a private server when nothing answers there; the
    result has ``ok`` (every order charged once or dead-lettered). A StreamworkError (no
    scenario, no server to use or start) ends the command with its message, exit status 1."""
    try:
        return load_example().run_demo(url, orders)
    except StreamworkError as exc:
        raise click.ClickException(str(exc)) from None
