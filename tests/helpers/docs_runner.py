"""Run the ```python blocks of one Markdown document, in order, in one namespace.

``python -m tests.helpers.docs_runner DOC NAME STATUS [BLOCK_TIMEOUT]``: DOC is the document's path,
NAME how messages call it (its path in the repository), STATUS a file that gets one line
``start <line>`` before each block and ``done`` at the end, so that whoever started this
process knows which block it was in when it failed or hung. The blocks share the namespace
of a module named ``docs`` (so code under ``if __name__ == "__main__":`` does not run).
A block that raises ends the run with exit status 1 and a traceback whose frames name the
document and its lines; one that runs longer than BLOCK_TIMEOUT seconds (default 30) ends
it too, after every thread's stack is printed.

``python -m tests.helpers.docs_runner --serve`` is how tests/test_docs.py uses it: it imports what
documents use (streamwork, redis, asyncio) once, then for each request line (JSON: the
arguments above, the files for the document's output, its working directory and
environment) forks a process that runs that document, and answers with a line giving the
process's pid, then one with its exit status: a fresh process per document, without each
one importing redis again.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import json
import linecache
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any

_HOOKS = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "mdblocks.py"


def load_mdblocks() -> types.ModuleType:
    """docs/hooks/mdblocks.py (the block scanner the site's build hook uses too)."""
    spec = importlib.util.spec_from_file_location("streamwork_docs_mdblocks", _HOOKS)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def _report(error: BaseException, name: str, line: int) -> None:
    """The traceback from the document's first frame on (the runner's own frames cut)."""
    frames = traceback.extract_tb(error.__traceback__)
    first = next((i for i, f in enumerate(frames) if f.filename == name), len(frames))
    text = "".join(traceback.format_list(frames[first:])
                   + traceback.format_exception_only(type(error), error))
    sys.stderr.write(f"{name}:{line}: the ```python block starting on this line raised "
                     f"{type(error).__name__}:\nTraceback (most recent call last):\n{text}")


def main(argv: list[str]) -> int:
    doc, name, status = Path(argv[0]), argv[1], Path(argv[2])
    block_timeout = float(argv[3]) if len(argv) > 3 else 30.0
    text = doc.read_text(encoding="utf-8")
    # tracebacks show the document's own lines
    linecache.cache[name] = (len(text), None, text.splitlines(keepends=True), name)
    module = types.ModuleType("docs")
    sys.modules["docs"] = module
    with status.open("w", buffering=1) as out:
        for block in load_mdblocks().blocks(text):
            if not block.is_python:
                continue
            out.write(f"start {block.line}\n")
            # the code on its own lines of the document: tracebacks give real line numbers
            source = "\n" * (block.first - 1) + block.code
            faulthandler.dump_traceback_later(block_timeout, exit=True)
            try:
                exec(compile(source, name, "exec"), module.__dict__)
            except BaseException as error:
                faulthandler.cancel_dump_traceback_later()
                _report(error, name, block.line)
                sys.stdout.flush()
                sys.stderr.flush()
                return 1
            faulthandler.cancel_dump_traceback_later()
        out.write("done\n")
    return 0


def serve() -> None:
    """Fork one process per request line on stdin (see the module's docstring)."""
    import asyncio  # noqa: F401  (imported once here, not once per document)

    import msgpack  # noqa: F401
    import redis
    import redis.asyncio  # noqa: F401

    import streamwork
    import streamwork.testing

    for name in streamwork.__all__:
        getattr(streamwork, name)  # the lazily imported classes too
    load_mdblocks()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the document's process
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)


def _child(request: dict[str, Any]) -> None:
    """Run one document as the request says, then end this process."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
        os.chdir(request["cwd"])
        os.environ.update(request["env"])
        code = main(request["args"])
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
        sys.exit(0)
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # threads a block left behind (a client's pool, an executor) must not keep us alive
    os._exit(code)
