"""Benchmark figures have one source, benchmarks/figures.json, and every page quotes them
from it: a quote is the figure's text right before ``<!--fig:NAME-->`` (hidden when the
Markdown is rendered, on the site and on a code host). A quote that differs from the
source, a marker naming no figure, a figure quoted nowhere, or, on a page that quotes
throughput, a figure without a marker, fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.helpers.docs_runner import load_mdblocks

mdblocks = load_mdblocks()

SOURCE = ROOT / "benchmarks" / "figures.json"
#: the pages that may quote figures (HISTORY.md keeps old runs' figures: not quoted)
PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md",
                *(ROOT / "docs").rglob("*.md")])
#: pages whose every throughput figure must be a quote: those a new user reads first
QUOTE_ALL = [ROOT / "README.md", ROOT / "docs" / "index.md",
             ROOT / "docs" / "explanations" / "comparison.md"]
_MARK = re.compile(r"<!--\s*fig:(?P<name>[\w.]+)\s*-->")
TIMES, DASH = "\u00d7", "\u2013"  # the sign of a ratio, the dash of a range
#: what counts as a figure on those pages, outside code blocks: a number with thousands
#: separators ("6,051"), a ratio (0.83 and TIMES), a number alone in a table cell, the
#: first number of a range (990, DASH, 1,448)
_FIGURE = re.compile(rf"\d{{1,3}}(?:,\d{{3}})+|\d+(?:\.\d+)?{TIMES}|(?<=\| )\d[\d.]*(?= \|)"
                     rf"|\d[\d,]*(?={DASH}\d)")


def _figures() -> dict[str, str]:
    """Each figure's name and the text a quote of it must be."""
    data: dict[str, Any] = json.loads(SOURCE.read_text(encoding="utf-8"))
    return {name: f["format"].format(f["value"]) for name, f in data["figures"].items()}


def _quotes(path: Path) -> list[tuple[int, str, str]]:
    """(line, figure name, the text before its marker) for every marker of ``path``."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in _MARK.finditer(line):
            out.append((n, m["name"], line[:m.start()]))
    return out


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_every_quote_is_its_figure() -> None:
    figures = _figures()
    wrong = []
    for path in PAGES:
        for n, name, before in _quotes(path):
            if name not in figures:
                wrong.append(f"{_name(path)}:{n}: no figure named {name!r} in {_name(SOURCE)}")
                continue
            text = figures[name]
            head = before[:-len(text)] if before.endswith(text) else None
            if head is None or re.search(r"[\d.,]$", head):
                got = re.search(r"[^\s(\[|]*$", before)
                wrong.append(f"{_name(path)}:{n}: quotes {got.group(0) if got else before!r} "
                             f"for {name}, which {_name(SOURCE)} says is {text!r}")
    assert not wrong, "\n".join(wrong)


def test_every_figure_is_quoted() -> None:
    quoted = {name for path in PAGES for _, name, _ in _quotes(path)}
    unused = sorted(set(_figures()) - quoted)
    assert not unused, f"figures no page quotes (drop them from {_name(SOURCE)}): {unused}"


@pytest.mark.parametrize("path", QUOTE_ALL, ids=_name)
def test_figures_on_the_first_pages_are_quotes(path: Path) -> None:
    """On the pages a new user reads first, every figure comes from the source."""
    text = path.read_text(encoding="utf-8")
    code = mdblocks.code_lines(text)
    bare = []
    for n, line in enumerate(text.splitlines()):
        if n in code:
            continue
        for m in _FIGURE.finditer(line):
            if not _MARK.match(line, m.end()):
                bare.append(f"{_name(path)}:{n + 1}: {m.group(0)!r}")
    assert not bare, ("figures without a <!--fig:NAME--> marker (add them to "
                      f"{_name(SOURCE)} and quote them):\n" + "\n".join(bare))
