"""Fenced code blocks of a Markdown document, with their line numbers; standard library only.

Shared by the site's build hook (which must not rewrite links inside code) and by
tests/test_docs.py (which runs every ```python block). Fences may be indented (inside a list
item, an admonition or a content tab, as pymdownx.superfences allows), use backticks or
tildes, and close with a fence of the same character at least as long as the opening one.
Blocks inside an HTML comment are not shown on the page, so they are not blocks here either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: an opening fence: indent, three or more backticks or tildes, the info string
_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>.*?)[ \t]*$")

#: the languages whose blocks are Python (and so are run by the tests)
PYTHON = frozenset({"python", "py", "python3"})


@dataclass(frozen=True)
class Block:
    """One fenced block: ``line`` is the 1-based line of its opening fence, ``first`` the
    1-based line of its first code line, ``end`` that of its closing fence (or the last
    line of the document when it is never closed)."""

    language: str
    info: str
    code: str
    line: int
    first: int
    end: int

    @property
    def is_python(self) -> bool:
        return self.language in PYTHON


def _language(info: str) -> str:
    """The language an info string names: ``python``, ``python title="x.py"``,
    ``{.python .copy}`` and ``{ .python }`` all give "python"."""
    word = info.strip().lstrip("{").strip().split(" ", 1)[0] if info.strip() else ""
    return word.lstrip(".").rstrip("}").lower()


def _dedent(line: str, indent: int) -> str:
    """``line`` without the first ``indent`` columns of leading whitespace (no more)."""
    i = 0
    while i < indent and i < len(line) and line[i] in " \t":
        i += 1
    return line[i:]


def blocks(text: str) -> list[Block]:
    """Every fenced code block of ``text``, in document order."""
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("<!--"):
            # an HTML comment: skip to its end (it may be on the same line)
            while "-->" not in lines[i]:
                i += 1
                if i == len(lines):
                    return found
            i += 1
            continue
        opening = _OPEN.match(line)
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            i += 1
            continue
        fence = opening["fence"]
        indent = len(opening["indent"].expandtabs(4))
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not closing.match(lines[i]):
            body.append(_dedent(lines[i], indent))
            i += 1
        end = min(i, len(lines) - 1)
        code = "\n".join(body) + ("\n" if body else "")
        found.append(Block(language=_language(opening["info"]), info=opening["info"],
                           code=code, line=start + 1, first=start + 2, end=end + 1))
        i += 1
    return found


def code_lines(text: str) -> set[int]:
    """The 0-based numbers of the lines of ``text`` that belong to a fenced block (fences
    included): what a link rewriter must leave alone."""
    inside: set[int] = set()
    for b in blocks(text):
        inside.update(range(b.line - 1, b.end))
    return inside
