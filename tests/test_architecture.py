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
#: the worker's core loop: reading, admission, starting, running, outcomes, leases, loops
CORE_LOOP = ["_worker/core/consumer.py", "_worker/core/holdings.py", "_worker/core/start.py",
             "_worker/core/runner.py", "_worker/core/outcomes.py", "_worker/core/leases.py",
             "_worker/core/delivery.py", "_worker/core/loops/heartbeat.py",
             "_worker/core/loops/reclaim.py", "_worker/core/loops/upkeep.py"]
#: raised from 2000 when the lock-quorum outage and the event loop's stall watch came in
#: (their logic lives in core/quorum.py and core/looplag.py; the loop only calls them)
CORE_LOOP_MAX = 2020


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


# ---- the worker's two rooms: the delivery core, and the features behind its seam -------

CORE = "streamwork._worker.core"
FEATURE_ROOM = "streamwork._worker.features"
#: what names a feature: its module, its class, the options it declares and the words a
#: reader takes for it. The core may say none of them (in identifiers: names, attributes,
#: arguments, definitions and imports; prose is free to explain what plugs in)
FEATURE_WORDS = {
    "pause", "paused", "pausing", "ordered", "priority", "priorities", "levels",
    "chains", "chained", "schedules", "scheduled", "partitions", "partitioned",
    "expires", "expiry", "middleware", "rate_limit", "concurrency_key",
    "concurrency_per_key", "order_key", "order_keys", "catch_up", "only_partitions",
    "priority_order", "priority_weights",
}


def _feature_words() -> set[str]:
    """`FEATURE_WORDS` and, from the registry, every feature's class name, module name
    and declared options: a new feature is covered without editing this test."""
    from streamwork._worker.features import FEATURES

    words = set(FEATURE_WORDS)
    for feature in FEATURES:
        words.add(feature.__name__.lower())
        words.add(feature.__module__.rsplit(".", 1)[-1])
        if feature.options is not None:
            words.update(n for n in vars(feature.options) if not n.startswith("_"))
    return words


def _identifiers(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = node.module.split(".")
        for name in names:
            yield getattr(node, "lineno", 0), name


def _named(name: str, words: set[str]) -> str | None:
    """The feature word ``name`` says: itself, or one of its snake_case or CamelCase
    parts (``Pausing``, ``self._levels``, ``order_key_of``)."""
    lowered = name.lower().strip("_")
    if lowered in words:
        return lowered
    parts = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower().strip("_").split("_")
    return next((p for p in parts if p in words), None)


CORE_MODULES = sorted(m for m in MODULES if m.startswith(CORE + ".") or m == CORE)


def test_the_worker_is_laid_out_as_core_and_features() -> None:
    assert CORE_MODULES, "no streamwork/_worker/core package"
    assert any(m.startswith(FEATURE_ROOM + ".") for m in MODULES)


@pytest.mark.parametrize("module", CORE_MODULES)
def test_a_core_module_imports_no_feature(module: str) -> None:
    """The delivery core imports nothing of the worker outside itself: no feature, not the
    options put together from the features' declarations, not the worker class."""
    outside = sorted(m for m in GRAPH[module]
                     if m.startswith("streamwork._worker") and not m.startswith(CORE))
    assert outside == [], f"{module} imports {outside}: plug it in at the seam instead"


@pytest.mark.parametrize("module", CORE_MODULES)
def test_a_core_module_names_no_feature(module: str) -> None:
    """No identifier of the core (name, attribute, argument, definition, import) names a
    feature or an option a feature declares."""
    words = _feature_words()
    hits = sorted({f"line {line}: {name} ({word})" for line, name in
                   _identifiers(MODULES[module]) if (word := _named(name, words))})
    assert hits == [], f"{module} names features:\n" + "\n".join(hits)


def test_the_feature_check_finds_a_feature_name() -> None:
    words = _feature_words()
    assert _named("Pausing", words) == "pausing"
    assert _named("self_levels", words) == "levels"
    assert _named("OrderedGate", words) in ("ordered", "orderedgate")
    assert _named("rate_limit", words) == "rate_limit"
    assert _named("ready", words) is None and _named("lease_expired", words) is None


def test_every_feature_plugs_in_at_the_seam() -> None:
    """Each registered feature is a `Feature` and declares help for every option it
    declares; every feature module's class is registered."""
    from streamwork._worker.core.seam import Feature
    from streamwork._worker.features import FEATURES

    for feature in FEATURES:
        assert issubclass(feature, Feature), feature
        declared = {n for n in vars(feature.options or object) if not n.startswith("_")}
        assert declared <= set(feature.help), f"{feature.__name__}: help missing for " \
            f"{sorted(declared - set(feature.help))}"
    import importlib
    import inspect

    for name in [m for m in MODULES if m.startswith(FEATURE_ROOM + ".")]:
        mod = importlib.import_module(name)
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if (issubclass(cls, Feature) and cls is not Feature
                    and cls.__module__ == name):
                assert cls in FEATURES, f"{name}.{cls.__name__} is not in FEATURES"
