"""A build hook of the wheel (pyproject.toml, ``[tool.hatch.build.targets.wheel.hooks.custom]``).

``streamwork demo`` runs the scenario of ``examples/demo.py``: code to read, written with
the public API only, so it stays in examples/. An installed wheel has no examples/ folder,
so the wheel carries a copy at ``streamwork/_cli/demo_scenario.py``
(``streamwork/_cli/demo.py`` looks there first). Only the standard wheel: an editable
install runs the checkout's own file, and a copy in site-packages would only go stale.
"""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SCENARIO = "examples/demo.py"
IN_WHEEL = "streamwork/_cli/demo_scenario.py"


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Adds the demo's scenario to a standard (not editable) wheel."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version == "standard":
            build_data["force_include"][SCENARIO] = IN_WHEEL
