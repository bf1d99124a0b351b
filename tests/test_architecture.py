"""The package's shape, checked: modules import only downwards (capability packages in
layers), no two modules import each other even for typing only, and no module grows past
what one reader holds in mind.

Every ``import`` and ``from ... import`` of ``streamwork`` counts: at module level, inside
functions and under ``if TYPE_CHECKING``. A type-only cycle is still a coupling: the two
modules cannot be understood, tested or moved apart.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "streamwork"

#: lowest first; a module may import from its own package and from the packages of lower
#: layers only (the public ``errors`` sits low: everything raises its exceptions)
LAYERS: list[set[str]] = [
    {"_text"},                       # safe text of user values (no imports)
    {"errors"},                      # the public exceptions
    {"_wire"},                       # what is on the wire and in keys: pure, no I/O
    {"_redis"},                      # connections, fault classes, Lua scripts, servers
    {"_telemetry"},                  # OpenTelemetry and log lines
    {"_lock"},                       # Redlock and fencing
    {"_producer"},                   # sending, job status, cancel
    {"_ops"},                        # stats, thresholds, formatting, dead-letter operations
    {"_worker"},                     # the consumer and its loops
    {"_hosting"},                    # several workers, processes, health endpoints
    {"_dashboard"},                  # the web page
    {"_cli"},                        # the command line
    {"__init__", "__main__", "testing"},  # the public face
]
MAX_LINES = 450
#: the worker's core loop: reading, admission, running, outcomes, leases and its loops
CORE_LOOP = ["_worker/core/consumer.py", "_worker/core/holdings.py", "_worker/features/ordered.py",
             "_worker/core/runner.py", "_worker/core/outcomes.py", "_worker/core/leases.py",
             "_worker/core/delivery.py", "_worker/core/loops/heartbeat.py",
             "_worker/core/loops/reclaim.py", "_worker/core/loops/upkeep.py"]
CORE_LOOP_MAX = 1600


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 2:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> Iterator[str]:
    """Every streamwork module ``path`` imports, wherever the import statement stands."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "streamwork":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield full if full in MODULES else node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "streamwork":
                    yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; write streamwork.<package>...")


GRAPH = {name: {m for m in _imports(path) if m in MODULES and m != name}
         for name, path in MODULES.items()}


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"{module}: its package {top!r} is in no layer of LAYERS")


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        _layer(module)


def test_imports_only_go_down() -> None:
    upward = [f"{a} -> {b}" for a, outs in GRAPH.items() for b in sorted(outs)
              if _layer(b) > _layer(a)]
    assert upward == [], "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_not_even_for_typing() -> None:
    assert _cycles(GRAPH) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_the_line_budget(module: str) -> None:
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{module}: {lines} lines (at most {MAX_LINES}): split it"


def test_the_core_loop_stays_small() -> None:
    sizes = {name: len((PACKAGE / name).read_text(encoding="utf-8").splitlines())
             for name in CORE_LOOP if (PACKAGE / name).exists()}
    assert sum(sizes.values()) <= CORE_LOOP_MAX, sizes


MAP_PAGE = PACKAGE.parent / "docs" / "explanations" / "architecture.md"


def test_the_architecture_page_maps_every_module() -> None:
    """docs/explanations/architecture.md names every module (``_worker/core/runner.py``) and
    no module that is gone, so the map stays true as the code moves."""
    text = MAP_PAGE.read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)`", text))
    files = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
             if p.name != "__init__.py" or p.parent == PACKAGE}
    assert sorted(files - named) == [], "modules missing from the architecture page"
    # prose may name a module by its file name alone (`runner.py`) where its package is clear
    short = {name.rsplit("/", 1)[-1] for name in files}
    gone = {name for name in named - files
            if not name.startswith("tests/") and ("/" in name or name not in short)}
    assert sorted(gone) == [], "the architecture page names modules that are gone"
