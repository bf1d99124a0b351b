"""MkDocs hook: reference tables generated from the code at build time, and links to files of
the repository outside docs/.

- A page line ``<!-- streamwork: NAME -->`` is replaced by the table NAME makes (see
  `TABLES`): the worker options from ``WorkerOptions``/``HELP`` and the ``streamwork run``
  command, the Python-only options from ``StreamWorker``'s attribute comments, the Redis keys
  from ``_keys.py``, the job options from ``_wire/job_options.py``. An unknown NAME fails
  the build. A page may also keep a copy of the table in its Markdown, so that it reads on a
  code host too: the marker line, the table, then ``<!-- /streamwork -->``. The build
  checks the copy against what the code makes and fails when they differ; ``python
  docs/hooks/reference.py`` rewrites every copy from the code.
- A relative link from a page to a file of the repository outside docs/ (say
  ``../examples/demo.py``, as it works when the Markdown is read in the repository) is
  served from the site's ``_repo/`` folder, where the file is copied; a link to a file that
  does not exist is left as it is, and the strict build fails on it.
"""

from __future__ import annotations

import inspect
import io
import re
import textwrap
import tokenize
import typing
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import mdblocks  # docs/hooks/mdblocks.py (MkDocs puts a hook's folder on the path to load it)
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
REPO_DIR = "_repo"  # where the site keeps copies of repository files that pages link to

_MARKER = re.compile(r"^[ \t]*<!--\s*streamwork:\s*(?P<name>[\w -]+?)\s*-->[ \t]*$", re.M)
#: a marker followed by the page's own copy of its table, closed by ``<!-- /streamwork -->``
_COPY = re.compile(r"^[ \t]*<!--\s*streamwork:\s*(?P<name>[\w -]+?)\s*-->[ \t]*\n"
                   r"(?P<copy>.*?)^[ \t]*<!--\s*/streamwork\s*-->[ \t]*$", re.M | re.S)
# inline links and images: [text](target "title") / ![alt](target)
_LINK = re.compile(r"(?P<head>!?\[[^\]\n]*\]\()(?P<target>[^)\s#]+)(?P<tail>[^)\n]*\))")


# --- worker options -------------------------------------------------------------------------


def _type_text(hint: Any) -> str:
    """``float``, ``float | None``, ``tuple[str, ...] | None``: a type as it is written."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _default_text(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024 \
            and value % 1024 == 0:
        kib = value // 1024
        human = f"{kib // 1024} MiB" if kib % 1024 == 0 else f"{kib} KiB"
        return f"`{value!r}` ({human})"
    return f"`{value!r}`"


def _help_text(text: str) -> str:
    """A ``run --help`` line as a sentence of the table: ``"s of idle time ..."`` (the
    help's short form for a number of seconds) reads "Seconds of idle time ..."."""
    if text.startswith(("s ", "s, ")):
        text = "seconds" + text[1:]
    return _sentence(text)


def _cell(text: str) -> str:
    """``text`` (prose with `code` spans) safe inside a Markdown table cell: ``|`` and ``<``
    outside code spans are escaped (inside them, the table extension keeps ``|`` and ``<``
    is shown as it is)."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(part if part.startswith("`") else
                   part.replace("|", "\\|").replace("<", "&lt;") for part in parts)


def _sentence(text: str) -> str:
    return _cell(text[:1].upper() + text[1:])


def _run_flags() -> dict[str, str]:
    """Each worker option's flag(s) on ``streamwork run``, as the command declares them."""
    from streamwork._cli.main import run

    flags: dict[str, str] = {}
    for param in run.params:
        if param.name is None or not param.opts:
            continue
        names = " / ".join(f"`{o}`" for o in (*param.opts, *param.secondary_opts))
        if getattr(param, "multiple", False):
            names += " (repeatable)"
        flags[param.name] = names
    return flags


def worker_options() -> str:
    """The table of every option ``WorkerOptions`` declares."""
    from streamwork._worker import config

    flags = _run_flags()
    rows = ["| option | type | default | what it does |", "|---|---|---|---|"]
    for name, hint in config.option_types().items():
        if name not in config.HELP:
            raise PluginError(f"worker option {name!r} has no help text in "
                              "streamwork/_worker/config.py HELP: add one")
        if name not in flags:
            raise PluginError(f"worker option {name!r} has no `streamwork run` flag")
        default = getattr(config.WorkerOptions, name)
        shown = "(required)" if name in ("stream", "group") else _default_text(default)
        rows.append(f"| {_anchor(name)}`{name}` | `{_type_text(hint)}` | {shown} | "
                    f"{_help_text(config.HELP[name])}. CLI: {flags[name]} |")
    return "\n".join(rows)


def _anchor(name: str) -> str:
    """A link target for the option's row: ``options.md#visibility_timeout``."""
    return f'<span id="{name}"></span>'


def _attribute_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines right above each attribute of ``cls``'s own body."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[str, str] = {}
    pending: list[str] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.string.startswith("#:"):
            pending.append(token.string[2:].strip())
        elif token.type == tokenize.NAME and pending and token.start[1] == 4:
            comments[token.string] = " ".join(pending)
            pending = []
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                                tokenize.DEDENT, tokenize.COMMENT):
            pending = []
    return comments


def python_options() -> str:
    """The table of the options only Python code can give (functions, types, caches)."""
    from streamwork._worker import worker as _worker

    comments = _attribute_comments(_worker.StreamWorker)
    rows = ["| option | default | what it does |", "|---|---|---|"]
    for name in _worker._CLASS_OPTIONS:
        if name not in comments:
            raise PluginError(f"StreamWorker.{name} has no `#:` comment above it: add one")
        text = re.sub(r"``([^`]+)``", r"`\1`", comments[name])
        default = getattr(_worker.StreamWorker, name)
        rows.append(f"| {_anchor(name)}`{name}` | {_default_text(default)} | "
                    f"{_sentence(text)} |")
    return "\n".join(rows)


# --- Redis keys -----------------------------------------------------------------------------

#: the Redis type of each key (the code builds names only); a key missing here fails the
#: build, so a new one cannot go undocumented
KEY_TYPES = {
    "dead": "stream", "delayed": "zset", "fence": "string", "partitions": "string",
    "retry": "stream", "retries": "zset", "settings": "hash", "owner": "string",
    "members": "zset", "rate": "hash", "semaphore": "zset", "job": "string",
    "tick": "string", "schedules": "hash", "outbox": "stream", "chained": "string",
    "paused": "hash", "progress": "string", "join": "hash", "join_results": "hash",
    "sent": "string",
}


def _doc(obj: Any) -> str:
    text = " ".join((inspect.getdoc(obj) or "").split())
    return _cell(re.sub(r"``([^`]+)``", r"`\1`", text))


def _key_rows(owner: type, instance: Any) -> list[str]:
    rows = []
    for name, member in vars(owner).items():
        if name.startswith("_") or name.endswith("_prefix"):
            continue
        if isinstance(member, property):
            key = getattr(instance, name)
        elif inspect.isfunction(member):
            params = [f"<{p.replace('_', ' ')}>"
                      for p in list(inspect.signature(member).parameters)[1:]]
            key = member(instance, *params)
            if isinstance(key, str):  # a length put in front of a placeholder is its own
                for p in params:
                    key = key.replace(f"{len(p.encode())}:{p}", f"<len>:{p}")
        else:
            continue
        if not isinstance(key, str):
            continue
        if name not in KEY_TYPES:
            raise PluginError(f"the key {owner.__name__}.{name} ({key}) has no Redis type in "
                              "docs/hooks/reference.py KEY_TYPES: add it")
        rows.append(f"| `{key}` | {KEY_TYPES[name]} | {_doc(member)} |")
    return rows


def redis_keys() -> str:
    """The table of the keys of stream ``orders`` and its group ``billing``."""
    from streamwork._wire import keys as _keys

    keys = _keys.StreamKeys.for_stream("orders")
    rows = ["| key (stream `orders`, group `billing`) | type | what |", "|---|---|---|"]
    rows += _key_rows(_keys.StreamKeys, keys)
    rows += _key_rows(_keys.GroupKeys, keys.group("billing"))
    from streamwork._wire import priorities

    high, low = priorities.sibling_streams(keys)
    rows.append(f"| `{high}`, `{low}` | stream | {_doc(priorities.level_stream)} |")
    return "\n".join(rows)


def redlock_keys() -> str:
    """The table of the keys a Redlock keeps on each of its masters."""
    from streamwork._wire import keys as _keys

    resource = "streamwork-<digest>"
    rows = ["| key | type | what |", "|---|---|---|",
            f"| `{_keys.redlock_key(resource)}` | string | {_doc(_keys.redlock_key)} |",
            f"| `{_keys.redlock_fence_key(resource)}` | string | "
            f"{_doc(_keys.redlock_fence_key)} |"]
    return "\n".join(rows)


def job_options() -> str:
    """The table of the job options, from their declaration (``_wire/job_options.py``)."""
    from streamwork._wire import job_options as _options

    rows = ["| option (`send` / `send_many`) | `--flag` | what | in `o` | value on the wire | "
            "left out when |", "|---|---|---|---|---|---|"]
    for o in _options.OPTIONS:
        names = f"`{o.name}`" + ("" if o.many == o.name else f" / `{o.many}` (one per job)")
        if o.wire is None:
            wire, value, omitted = "—", "not carried: it routes the send", "—"
        else:
            wire, value = f"`{o.wire}`", _cell(o.wire_help)
            default = ("it is the job's key (`k`)" if o.default is _options.JOB_KEY
                       else "" if o.default is None else f"it is `{o.default}`")
            omitted = f"not given, or {default}" if default else "not given"
        flag = "--" + o.name.replace("_", "-")
        rows.append(f"| {names} | `{flag}` | {_cell(o.help)} | {wire} | {value} | {omitted} |")
    return "\n".join(rows)


# --- summaries of the pages built by plugins (so they read on a code host too) ------------


#: a first sentence: up to a full stop that is not part of an ellipsis ("MODULE:Worker...")
_SENTENCE = re.compile(r"(.+?(?<!\.)[.!?](?!\.))(\s|$)")


def _first_sentence(obj: Any) -> str:
    """The first sentence of ``obj``'s docstring, in Markdown."""
    text = " ".join((inspect.getdoc(obj) or "").split("\n\n")[0].split())
    found = re.match(_SENTENCE, text)
    return _cell(re.sub(r"``([^`]+)``", r"`\1`", found.group(1) if found else text))


def api_summary() -> str:
    """The public names of ``streamwork`` (``__all__``), each with its docstring's first
    sentence."""
    import streamwork

    rows = ["| name | what |", "|---|---|"]
    for name in sorted(streamwork.__all__, key=str.lower):
        if not name.startswith("_"):
            rows.append(f"| `sw.{name}` | {_first_sentence(getattr(streamwork, name))} |")
    return "\n".join(rows)


def cli_summary() -> str:
    """The ``streamwork`` commands, each with the first sentence of its help."""
    from streamwork._cli.main import main

    rows = ["| command | what |", "|---|---|"]
    for name, command in main.commands.items():
        help_text = " ".join((command.help or "").split("\n\n")[0].split())
        found = re.match(_SENTENCE, help_text)
        rows.append(f"| `streamwork {name}` | {_cell(found.group(1) if found else help_text)} |")
    return "\n".join(rows)


#: what each ``<!-- streamwork: NAME -->`` line is replaced by
TABLES: dict[str, Callable[[], str]] = {
    "job options": job_options,
    "worker options": worker_options,
    "python options": python_options,
    "redis keys": redis_keys,
    "redlock keys": redlock_keys,
    "api summary": api_summary,
    "cli summary": cli_summary,
}


def _made(name: str, where: str) -> str:
    """The table ``name`` as the code makes it; PluginError for an unknown name."""
    key = name.strip().lower()
    if key not in TABLES:
        raise PluginError(f"{where}: no table named {key!r} (known: {', '.join(TABLES)})")
    return TABLES[key]()


def stale_copies(text: str, where: str = "page") -> list[str]:
    """The names of the tables whose copy in ``text`` differs from what the code makes."""
    return [m["name"] for m in _COPY.finditer(text)
            if m["copy"].strip() != _made(m["name"], where).strip()]


def write_copies(text: str, where: str = "page") -> str:
    """``text`` with every table copy rewritten from the code."""
    return _COPY.sub(lambda m: (f"<!-- streamwork: {m['name']} -->\n"
                                f"{_made(m['name'], where).strip()}\n<!-- /streamwork -->"),
                     text)


def _fill_copies(markdown: str, where: str) -> str:
    """Each table copy checked against the code (PluginError when it differs), then left as
    the table alone."""
    stale = stale_copies(markdown, where)
    if stale:
        raise PluginError(f"{where}: the copy of the table(s) {', '.join(map(repr, stale))} "
                          "differs from what the code makes; run `python "
                          "docs/hooks/reference.py` to rewrite it")
    return _COPY.sub(lambda m: _made(m["name"], where).strip(), markdown)


# --- links to repository files --------------------------------------------------------------


def _outside_target(page_src: str, target: str, docs_dir: Path) -> Path | None:
    """The repository file a relative link of page ``page_src`` (relative to docs/) points
    to when it lies outside docs/; None for anything else (a page, a URL, a missing file)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith(("/", "#")):
        return None
    path = (docs_dir / PurePosixPath(page_src).parent / target).resolve()
    if path.is_relative_to(docs_dir) or not path.is_relative_to(ROOT) or not path.is_file():
        return None
    if path.suffix == ".md":
        return None  # a page outside docs/ is not a page of the site: the build says so
    return path


def _links(text: str) -> list[tuple[int, re.Match[str]]]:
    """The links of ``text`` outside its code blocks, as (line number, match)."""
    skip = mdblocks.code_lines(text)
    return [(n, m) for n, line in enumerate(text.splitlines()) if n not in skip
            for m in _LINK.finditer(line)]


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add a copy of each repository file that a page links to, under ``_repo/``."""
    docs_dir = Path(config.docs_dir).resolve()
    wanted: set[Path] = set()
    for file in files.documentation_pages():
        text = Path(file.abs_src_path or "").read_text(encoding="utf-8")
        for _, link in _links(text):
            target = _outside_target(file.src_uri, link["target"], docs_dir)
            if target is not None:
                wanted.add(target)
    for path in sorted(wanted):
        uri = f"{REPO_DIR}/{path.relative_to(ROOT).as_posix()}"
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Fill in the generated tables; point links to repository files at their copies."""

    def table(found: re.Match[str]) -> str:
        return _made(found["name"], page.file.src_uri)

    markdown = _fill_copies(markdown, page.file.src_uri)
    docs_dir = Path(config.docs_dir).resolve()
    lines = markdown.splitlines(keepends=True)
    for n, link in reversed(_links(markdown)):
        target = _outside_target(page.file.src_uri, link["target"], docs_dir)
        if target is None:
            continue
        copy = PurePosixPath(REPO_DIR, target.relative_to(ROOT).as_posix())
        here = PurePosixPath(page.file.src_uri).parent
        relative = Path(*[".."] * len(here.parts), copy).as_posix() if here.parts \
            else copy.as_posix()
        line = lines[n]
        lines[n] = line[:link.start("target")] + relative + line[link.end("target"):]
    skip = mdblocks.code_lines(markdown)
    out = []
    for n, line in enumerate(lines):
        out.append(line if n in skip else _MARKER.sub(table, line))
    return "".join(out)


if __name__ == "__main__":  # python docs/hooks/reference.py: rewrite the pages' table copies
    for path in sorted((ROOT / "docs").rglob("*.md")):
        old = path.read_text(encoding="utf-8")
        new = write_copies(old, str(path.relative_to(ROOT)))
        if new != old:
            path.write_text(new, encoding="utf-8")
            print(f"rewrote the tables of {path.relative_to(ROOT)}")
