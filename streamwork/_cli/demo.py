"""``streamwork demo``: runs the billing demo of ``examples/demo.py``.

The scenario lives in the examples, written with the public API only, so that what the
demo shows is also code to read. A wheel carries a copy of it inside the package
(``demo_scenario.py`` here, put there by the build hook in hatch_build.py); a source
checkout (an editable install, as ``make demo`` makes) has it next to the package.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import click

from streamwork.errors import StreamworkError

#: where an installed wheel has the scenario
PACKAGED = Path(__file__).resolve().with_name("demo_scenario.py")
#: where the scenario is in a source checkout
CHECKOUT = Path(__file__).resolve().parents[2] / "examples" / "demo.py"
#: the scenario this installation runs
EXAMPLE = PACKAGED if PACKAGED.is_file() else CHECKOUT
_MODULE = "streamwork_examples_demo"


def load_example() -> ModuleType:
    """The module of the demo's scenario, loaded once; StreamworkError when this
    installation has none (neither a wheel's copy nor a checkout's examples/demo.py)."""
    loaded = sys.modules.get(_MODULE)
    if loaded is not None:
        return loaded
    if not EXAMPLE.is_file():
        raise StreamworkError(
            f"the demo's scenario {EXAMPLE} is missing (this installation of streamwork is "
            "incomplete): reinstall it (pip install --force-reinstall streamwork), or run "
            "`make demo` in a clone of the repository")
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
