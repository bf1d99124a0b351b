"""The documentation is tested like code.

- Every ```python block of README.md and docs/**/*.md runs: per document, in order, in one
  namespace (a module named ``docs``), with $REDIS_URL pointing at a private, empty
  redis-server started for that document. Each document runs in a process of its own
  (tests/helpers/docs_runner.py), so a block that hangs or changes the process cannot touch the
  next one; a failure names the document and the line of the block.
- The site builds with ``mkdocs build --strict`` (once per test session): a broken link, a
  page missing from the nav or a name mkdocstrings cannot find fails it. The built pages
  are checked for what they must contain (every public name, command and option), for
  running every Python block they show, and for loading nothing from other hosts.
- README.md's relative links point at files that exist.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from typing import Any

import click
import pytest

import streamwork
import streamwork.testing
from streamwork._redis.server import RedisServer
from tests.conftest import ROOT
from tests.helpers.docs_runner import load_mdblocks

mdblocks = load_mdblocks()

FIXTURES = Path(__file__).resolve().parent / "docs_fixtures"
#: the documents whose blocks run: the README and every page of the site
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
#: seconds one block may run (blocks are meant to take a few) and one document in all
BLOCK_TIMEOUT = float(os.environ.get("STREAMWORK_DOCS_BLOCK_TIMEOUT", "30"))
DOCUMENT_TIMEOUT = 120.0


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@dataclass
class Run:
    """How running one document's blocks went: ``message`` says what failed and where."""

    ok: bool
    message: str
    stdout: str


def _tail(text: str, lines: int = 40) -> str:
    kept = text.splitlines()[-lines:]
    return "\n".join(kept)


class Runner:
    """tests/helpers/docs_runner.py in its ``--serve`` form: one process that imports streamwork
    and redis once and forks a fresh process per document."""

    def __init__(self) -> None:
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.docs_runner", "--serve"], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.replies.put(json.loads(line))
        self.replies.put(None)  # the runner ended

    def _reply(self, timeout: float | None = None) -> dict[str, Any]:
        reply = self.replies.get(timeout=timeout)
        if reply is None:
            raise AssertionError(f"tests/helpers/docs_runner.py --serve ended (status "
                                 f"{self.proc.wait()}); its errors are above")
        return reply

    def run(self, request: dict[str, Any], timeout: float) -> tuple[int, bool]:
        """Run one document; its exit status, and whether it was killed for being late."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = self._reply(timeout=60)["pid"]
        try:
            return self._reply(timeout=timeout)["exit"], False
        except queue.Empty:
            os.kill(pid, signal.SIGKILL)
            return self._reply(timeout=60)["exit"], True

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture(scope="session", name="runner")
def _runner() -> Iterator[Runner]:
    runner = Runner()
    yield runner
    runner.close()


def run_document(path: Path, runner: Runner, make_server: Callable[..., RedisServer],
                 block_timeout: float = BLOCK_TIMEOUT) -> Run:
    """Run the python blocks of ``path`` in a process of their own, against a new private
    server."""
    name = _name(path)
    if not any(b.is_python for b in mdblocks.blocks(path.read_text(encoding="utf-8"))):
        return Run(True, f"{name}: no python blocks", "")
    server = make_server()
    with tempfile.TemporaryDirectory(prefix="streamwork-docs-") as workdir:
        # the blocks run in a temporary working directory: files they write land there
        files = Path(workdir) / ".docs"
        files.mkdir()
        status_file, out_file, err_file = (files / n for n in ("status", "stdout", "stderr"))
        started = time.monotonic()
        code, timed_out = runner.run({
            "args": [str(path), name, str(status_file), str(block_timeout)],
            "stdout": str(out_file), "stderr": str(err_file), "cwd": workdir,
            "env": {"REDIS_URL": server.url}}, timeout=DOCUMENT_TIMEOUT)
        seconds = time.monotonic() - started
        lines = status_file.read_text().splitlines() if status_file.exists() else []
        out = out_file.read_text(errors="replace") if out_file.exists() else ""
        err = err_file.read_text(errors="replace") if err_file.exists() else ""
    if code == 0 and lines[-1:] == ["done"]:
        return Run(True, f"{name}: every python block ran ({seconds:.1f} s)", out)
    where = f"{name}:{lines[-1].split()[1]}" if lines and lines[-1].startswith("start") \
        else name
    if timed_out:
        why = f"{where}: the document did not finish within {DOCUMENT_TIMEOUT:g} s\n{err}"
    elif "Timeout (" in err:
        why = (f"{where}: the ```python block starting on this line did not finish within "
               f"{block_timeout:g} s (blocks must end on their own, and stop the workers they "
               f"start); where each thread was:\n{err}")
    elif err.startswith(f"{where}: "):
        why = err  # the runner's own report: the block's line, then the traceback
    else:
        why = f"{where}: exit status {code}\n{err}"
    return Run(False, f"{_tail(why)}\n--- what the blocks printed ---\n{_tail(out, 20)}", out)


# --- the documents --------------------------------------------------------------------------


@pytest.mark.timeout(DOCUMENT_TIMEOUT + 60)
@pytest.mark.usefixtures("site_build")  # the site builds meanwhile
@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_python_blocks_run(path: Path, runner: Runner,
                           make_server: Callable[..., RedisServer]) -> None:
    """Every ```python block of the document runs without error, in order."""
    run = run_document(path, runner, make_server)
    assert run.ok, run.message


def _readme_links() -> list[tuple[int, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    skip = mdblocks.code_lines(text)
    found = []
    for n, line in enumerate(text.splitlines()):
        if n in skip:
            continue
        # inline links and images; reference definitions ([x]: target)
        found += [(n + 1, m) for m in re.findall(r"!?\[[^\]\n]*\]\(([^)\s]+)[^)\n]*\)", line)]
        found += [(n + 1, m) for m in re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", line)]
    return found


def test_readme_relative_links_exist() -> None:
    """Every relative link (and image) of README.md points at a file or folder that exists."""
    links = _readme_links()
    assert links, "README.md has no links at all: the link scan is broken"
    broken = []
    for line, target in links:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # a URL (http:, mailto:) or an anchor of the README itself
        path = target.split("#", 1)[0]
        if not (ROOT / path).exists():
            broken.append(f"README.md:{line}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


# --- the harness itself ---------------------------------------------------------------------


def test_harness_runs_blocks_in_one_namespace(runner: Runner,
                                              make_server: Callable[..., RedisServer]) -> None:
    """The fixture document's blocks share a namespace named ``docs``, and only python
    blocks that the page shows run (in lists and admonitions too); each run of a document
    gets a new empty server."""
    session = FIXTURES / "session.md"
    found = [b.line for b in mdblocks.blocks(session.read_text()) if b.is_python]
    assert found == [9, 29, 35, 39, 51]
    for _ in range(2):  # the second run's first block sees an empty server again
        run = run_document(session, runner, make_server)
        assert run.ok, run.message
        assert "session ok" in run.stdout


def test_harness_names_the_failing_block(runner: Runner,
                                         make_server: Callable[..., RedisServer]) -> None:
    """A failing block fails its document's test with the document's path, the line of the
    block and a traceback through the document's own lines; later blocks do not run."""
    run = run_document(FIXTURES / "failing.md", runner, make_server)
    assert not run.ok
    assert run.message.startswith("tests/docs_fixtures/failing.md:9: the ```python block "
                                  "starting on this line raised AssertionError"), run.message
    assert 'File "tests/docs_fixtures/failing.md", line 11, in check' in run.message
    assert 'assert x == 2, "x is not 2"' in run.message
    assert "AssertionError: x is not 2" in run.message
    assert "not reached" not in run.message


def test_harness_stops_a_hanging_block(runner: Runner,
                                       make_server: Callable[..., RedisServer]) -> None:
    """A block that does not end is stopped after the block time limit, and the failure
    names its line and shows where it was."""
    run = run_document(FIXTURES / "hanging.md", runner, make_server, block_timeout=1.0)
    assert not run.ok
    assert run.message.startswith("tests/docs_fixtures/hanging.md:7: the ```python block "
                                  "starting on this line did not finish within 1 s"), \
        run.message
    assert re.search(r'File "tests/docs_fixtures/hanging.md", line [89]', run.message), \
        run.message


def test_block_scanner_agrees_with_commonmark() -> None:
    """On the README (no admonitions there), the scanner finds the same ```python blocks,
    with the same code, as a CommonMark parser (markdown-it, which rich brings)."""
    from markdown_it import MarkdownIt

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    tokens = MarkdownIt("commonmark").parse(text)
    expected = [(t.map[0] + 1, t.content) for t in tokens
                if t.type == "fence" and t.info.split(" ", 1)[0] in mdblocks.PYTHON and t.map]
    assert [(b.line, b.code) for b in mdblocks.blocks(text) if b.is_python] == expected


# --- the site -------------------------------------------------------------------------------


@dataclass
class Site:
    """A built site: ``page("reference/api.md")`` is that page's HTML."""

    root: Path

    def page(self, src: str) -> str:
        stem = src.removesuffix(".md")
        out = self.root / ("index.html" if stem == "index" else f"{stem}/index.html")
        return out.read_text(encoding="utf-8")


@dataclass
class Build:
    """The site's build, started in the background: ``proc`` writes the site into ``out``
    and its output into ``log``; ``missing`` says why it could not start."""

    proc: subprocess.Popen[bytes] | None
    out: Path
    log: Path
    missing: str = ""


@pytest.fixture(scope="session", name="site_build")
def _site_build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Build]:
    """Start ``mkdocs build --strict`` once per test session, in the background: the
    document tests ask for it first, so the site builds while their blocks run."""
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError:
        yield Build(None, Path(), Path(), "mkdocs is not installed (pip install -e '.[docs]')")
        return
    out = tmp_path_factory.mktemp("site")
    log = tmp_path_factory.mktemp("site-build") / "mkdocs.log"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    yield Build(proc, out, log)
    if proc.poll() is None:  # the session did not need the site after all
        proc.kill()
    proc.wait()


@pytest.fixture(scope="session", name="site")
def _site(site_build: Build) -> Site:
    """The site, built by ``mkdocs build --strict`` (which must pass)."""
    if site_build.proc is None:
        if os.environ.get("CI"):
            pytest.fail(f"the docs cannot be built on CI: {site_build.missing}")
        pytest.skip(site_build.missing)
    status = site_build.proc.wait(timeout=600)
    if status != 0:
        pytest.fail(f"mkdocs build --strict failed:\n{site_build.log.read_text()}")
    return Site(site_build.out)


@pytest.mark.timeout(660)
def test_site_builds_strict(site: Site) -> None:
    """``mkdocs build --strict`` passes (the fixture fails otherwise) and makes every page."""
    for path in (ROOT / "docs").rglob("*.md"):
        src = path.relative_to(ROOT / "docs").as_posix()
        assert "<h1" in site.page(src), src


@pytest.mark.timeout(660)
def test_site_runs_every_python_block_it_shows(site: Site) -> None:
    """Each page shows exactly the ```python blocks the tests run (none hides from them)."""
    for path in (ROOT / "docs").rglob("*.md"):
        src = path.relative_to(ROOT / "docs").as_posix()
        shown = len(re.findall(r'class="language-(?:python|py|python3) highlight"',
                               site.page(src)))
        run = sum(b.is_python for b in mdblocks.blocks(path.read_text(encoding="utf-8")))
        assert shown == run, f"docs/{src}: {shown} python blocks shown, {run} run"


@pytest.mark.timeout(660)
def test_site_loads_nothing_from_other_hosts(site: Site) -> None:
    """No page loads a script, a style sheet, a font or an image from another host: the
    site works offline and tells no one who reads it."""
    for page in site.root.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        remote = re.findall(r"<(?:script|img|iframe)\b[^>]*\bsrc=\"(?:https?:)?//[^\"]*\""
                            r"|<link\b[^>]*\bhref=\"(?:https?:)?//[^\"]*\"", html)
        assert not remote, f"{page.relative_to(site.root)}: {remote}"
    for css in site.root.rglob("*.css"):
        assert not re.search(r"@import\s+url\((?:\"|')?(?:https?:)?//", css.read_text()), css


@pytest.mark.timeout(660)
def test_api_page_documents_every_public_name(site: Site) -> None:
    """The API reference has a section for every name of ``streamwork.__all__`` (the errors
    among them, with the rest of ``streamwork.errors``) and for ``streamwork.testing``."""
    html = site.page("reference/api.md")
    missing = []
    for name in streamwork.__all__:
        if name == "__version__":
            continue
        value = getattr(streamwork, name)
        anchor = (f"streamwork.errors.{name}" if isinstance(value, type)
                  and issubclass(value, Exception) else f"streamwork.{name}")
        if f'id="{anchor}"' not in html:
            missing.append(anchor)
    for name in streamwork.testing.__all__:
        if f'id="streamwork.testing.{name}"' not in html:
            missing.append(f"streamwork.testing.{name}")
    assert not missing, f"docs/reference/api.md does not document: {missing}"


def _commands(group: click.Command, prefix: str) -> Iterator[str]:
    yield prefix
    if isinstance(group, click.Group):
        for name, command in group.commands.items():
            if not command.hidden:
                yield from _commands(command, f"{prefix} {name}")


@pytest.mark.timeout(660)
def test_cli_page_documents_every_command(site: Site) -> None:
    """The CLI reference has every command and subcommand, with every option of each."""
    from streamwork._cli.main import main

    text = unescape(re.sub(r"<[^>]+>", "", site.page("reference/cli.md")))
    missing = [c for c in _commands(main, "streamwork")
               if not re.search(rf"Usage:\s*{re.escape(c)}\s", text)]
    assert not missing, f"docs/reference/cli.md lacks: {missing}"
    from benchmarks.cli import bench_command

    for command in (main.commands["run"], bench_command):
        flags = {o for p in command.params for o in getattr(p, "opts", ()) if o.startswith("--")}
        absent = sorted(f for f in flags if not re.search(rf"{re.escape(f)}\b", text))
        assert not absent, f"docs/reference/cli.md lacks {command.name}'s options {absent}"
    assert re.search(r"\[default:\s+30\]", text)  # run --visibility-timeout, as in --help


@pytest.mark.timeout(660)
def test_options_page_lists_every_option(site: Site) -> None:
    """The worker options page has a row for every option, with its default and its help."""
    from streamwork._worker import config
    from streamwork._worker import worker as _worker

    html = site.page("reference/options.md")
    text = unescape(re.sub(r"<[^>]+>", "", html))
    for name in config.option_types():
        assert f'<td><span id="{name}"></span><code>{name}</code></td>' in html, name
        help_words = config.HELP[name].split()[1:4]
        assert " ".join(help_words) in text, (name, help_words)
    for name in _worker._CLASS_OPTIONS:
        assert f'<td><span id="{name}"></span><code>{name}</code></td>' in html, name
    assert "<td><code>30.0</code></td>" in html  # visibility_timeout's default


@pytest.mark.timeout(660)
def test_keys_page_lists_every_key(site: Site) -> None:
    """The keys page has the generated table: a key of each kind, the job record first."""
    html = unescape(site.page("reference/keys.md"))
    for key in ("{orders}:dead", "{orders}:job:7:billing:<key>", "{orders}:retry:7:billing",
                "{orders}:settings:7:billing", "redlock:{streamwork-<digest>}:fence"):
        assert f"<code>{key}</code>" in html, key


@pytest.mark.timeout(660)
def test_links_to_repository_files_are_served(site: Site) -> None:
    """A page's relative link to a file of the repository outside docs/ works on the site:
    the file is copied under _repo/ and the link points at the copy."""
    html = site.page("reference/keys.md")
    assert 'href="../../_repo/streamwork/_wire/keys.py"' in html
    assert (site.root / "_repo" / "streamwork" / "_wire" / "keys.py").read_bytes() == \
        (ROOT / "streamwork" / "_wire" / "keys.py").read_bytes()

