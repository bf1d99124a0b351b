"""`streamwork run --reload` on a real redis-server: a worker module in a temporary
directory is edited while the reloader runs it; the next job runs the new code, the job in
flight at the edit is finished by the old process (a graceful stop), and no job is lost or
run twice. Processes are found through /proc (Linux)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

import streamwork as sw
from streamwork._cli.main import main
from streamwork._hosting.reload import MISSING, app_dirs
from streamwork.testing import stream_idle, wait_for
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="finds child processes through /proc")
pytest.importorskip("watchfiles", reason="the `reload` extra is not installed")

STREAM, GROUP = "reload-jobs", "dev"
RELEASE = "reload-test:release"

APP = '''\
import asyncio
import os

import redis.asyncio as aioredis

import streamwork as sw

VERSION = {version!r}


class App(sw.StreamWorker):
    stream = {stream!r}
    group = {group!r}

    async def handle(self, msg: sw.Message) -> dict[str, object]:
        if msg.payload.get("hold"):  # wait until the test lets go of this job
            async with aioredis.Redis.from_url(msg.payload["hold"]) as client:
                while not await client.exists({release!r}):
                    await asyncio.sleep(0.05)
        return {{"version": VERSION, "pid": os.getpid()}}
'''


def write(path: Path, text: str) -> None:
    """Replace ``path`` in one step, as editors save (one change event, however slow the
    machine: a write in parts could be seen as two edits)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_app(path: Path, version: str) -> None:
    write(path, APP.format(version=version, stream=STREAM, group=GROUP, release=RELEASE))


def _ppid(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text.rsplit(")", 1)[1].split()[:2]
    return None if state in "ZX" else int(ppid)


def _children(parent: int) -> set[int]:
    return {int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and _ppid(int(e.name)) == parent}


Start = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture(name="start_reloader")
def _start_reloader(tmp_path: Path) -> Iterator[Start]:
    """Factory: `streamwork run TARGET --reload ...` in ``tmp_path`` (the app's directory),
    its output in tmp_path/reloader.log; ended by pid (its children with it) afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str, url: str, *args: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(ROOT),
               "PYTHONDONTWRITEBYTECODE": "1"}  # an edit within one second: no stale .pyc
        with (tmp_path / "reloader.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "streamwork", "run", target, "--url", url, "--reload",
                 "--log-level", "INFO", *args],
                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            children = _children(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            for pid in children:  # they would get SIGTERM from the kernel; don't wait for it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        proc.wait()


def _exactly(pids: set[int], n: int) -> set[int] | None:
    return pids if len(pids) == n else None


def _log(tmp_path: Path) -> str:
    return (tmp_path / "reloader.log").read_text(errors="replace")


def _lines(tmp_path: Path, text: str) -> list[str]:
    return [line for line in _log(tmp_path).splitlines() if text in line]


def _result(producer: sw.Producer, key: str) -> Any:
    return producer.result(STREAM, key, group=GROUP, timeout=60)


def test_an_edit_restarts_the_worker_gracefully_and_loses_nothing(
        redis_url: str, r: redis.Redis, start_reloader: Start, tmp_path: Path) -> None:
    """An edit of the app's module: one log line names it; the job the old process holds
    is finished by it (graceful stop) before the new process starts; the next job runs the
    new code. An edit that breaks the module: the child exits 1, the reloader waits; the
    fix starts a new child. Every job done once; SIGTERM ends it all with status 0."""
    app = tmp_path / "app.py"
    write_app(app, "v1")
    reloader = start_reloader("app:App", redis_url)
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(STREAM, {}, key="first")
        first = _result(producer, "first")
        assert first["version"] == "v1"
        old = first["pid"]
        assert _ppid(old) == reloader.pid, "the worker runs in a child of the reloader"
        argv = Path(f"/proc/{old}/cmdline").read_bytes().decode().split("\0")
        assert "app:App" in argv and "--url" in argv and "--reload" not in argv, argv

        # a job in flight when the code changes: held until the test lets go of it
        producer.send(STREAM, {"hold": redis_url}, key="held")
        wait_for(lambda: producer.status(STREAM, "held", group=GROUP).state == "running", 60,
                 message="the held job running")
        write_app(app, "v2 edited")
        producer.send(STREAM, {}, key="during")  # sent while the old process drains
        wait_for(lambda: _lines(tmp_path, "reloading: app.py changed"), 60,
                 message="the reload line")
        # the old process is draining: it still holds the job, no new one has started
        assert _ppid(old) == reloader.pid
        assert producer.status(STREAM, "held", group=GROUP).state == "running"
        r.set(RELEASE, 1)
        held = _result(producer, "held")
        assert held == {"version": "v1", "pid": old}, "the old process finishes its job"

        producer.send(STREAM, {}, key="after")
        after = _result(producer, "after")
        assert after["version"] == "v2 edited" and after["pid"] != old
        wait_for(lambda: _ppid(old) is None, 30, message="the old process gone")
        assert _result(producer, "during")["version"] in ("v1", "v2 edited")

        write(app, "this is not Python\n")  # a broken edit: the child cannot start
        wait_for(lambda: _lines(tmp_path, "it starts again on the next change"), 60,
                 message="the broken child's exit logged")
        assert "exit_code=1" in _lines(tmp_path, "it starts again on the next change")[0]
        assert reloader.poll() is None, "the reloader waits for the fix"
        write_app(app, "v3")
        producer.send(STREAM, {}, key="fixed")
        assert _result(producer, "fixed")["version"] == "v3"

        keys = ["first", "held", "during", "after", "fixed"]
        for key in keys:
            status = producer.status(STREAM, key, group=GROUP)
            assert (status.state, status.attempts) == ("done", 1), (key, status)
    wait_for(lambda: stream_idle(r, STREAM, GROUP), 30, message="nothing pending")
    assert len(_lines(tmp_path, "reloading: app.py changed")) == 3, _log(tmp_path)[-3000:]

    children = _children(reloader.pid)
    os.kill(reloader.pid, signal.SIGTERM)
    assert reloader.wait(timeout=60) == 0, _log(tmp_path)[-3000:]
    for pid in children:
        assert _ppid(pid) is None, f"child {pid} outlived the reloader"


def test_reload_dir_and_processes(redis_url: str, start_reloader: Start,
                                  tmp_path: Path) -> None:
    """`--reload-dir lib --processes 2`: an edit of a module under lib (which the app
    imports) restarts every worker process with the new code; an edit outside lib does
    not restart anything."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "version.py").write_text("VERSION = 'lib-1'\n")
    (tmp_path / "app.py").write_text(
        APP.format(version="unused", stream=STREAM, group=GROUP, release=RELEASE)
        .replace("VERSION = 'unused'", "import sys\nsys.path.insert(0, 'lib')\n"
                                       "from version import VERSION"))
    reloader = start_reloader("app:App", redis_url, "--reload-dir", "lib",
                              "--processes", "2", "--concurrency", "1")
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(STREAM, {}, key="one")
        assert _result(producer, "one")["version"] == "lib-1"
        supervisor = wait_for(lambda: next(iter(_children(reloader.pid)), None), 30,
                              message="the supervisor child")
        before = wait_for(lambda: _exactly(_children(supervisor), 2), 60,
                          message="two worker processes")

        (tmp_path / "notes.py").write_text("# outside --reload-dir\n")
        write(tmp_path / "lib" / "version.py", "VERSION = 'lib-2, edited'\n")
        wait_for(lambda: _lines(tmp_path, "reloading: lib/version.py changed"), 60,
                 message="the reload line")
        # the old processes may read jobs until they have stopped: send once they are gone
        # and the new supervisor runs two workers of its own
        wait_for(lambda: _ppid(supervisor) is None, 30, message="the old supervisor gone")
        assert all(_ppid(pid) is None for pid in before)
        wait_for(lambda: next((_exactly(_children(s), 2) for s in _children(reloader.pid)
                               if s != supervisor), None), 60,
                 message="the new supervisor's two worker processes")
        keys = [f"two-{i}" for i in range(6)]
        producer.send_many(STREAM, [{}] * len(keys), keys=keys)
        assert {_result(producer, k)["version"] for k in keys} == {"lib-2, edited"}
    [line] = _lines(tmp_path, "reloading:")
    assert "(and" not in line, line  # notes.py is not under --reload-dir
    os.kill(reloader.pid, signal.SIGTERM)
    assert reloader.wait(timeout=60) == 0, _log(tmp_path)[-3000:]


def test_without_watchfiles_the_message_says_what_to_install(tmp_path: Path) -> None:
    """No watchfiles (the `reload` extra): exit 1 naming the package and the extra."""
    fake = tmp_path / "shadow" / "watchfiles"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'watchfiles'\", name='watchfiles')\n")
    (tmp_path / "app.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "streamwork", "run", "app:App", "--reload"], cwd=tmp_path,
        env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert MISSING in done.stderr
    assert "pip install 'streamwork[reload]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_reload_dir_needs_reload(tmp_path: Path) -> None:
    """--reload-dir alone is refused, saying to add --reload."""
    result = CliRunner().invoke(main, ["run", "app:App", "--reload-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert "--reload-dir is an option of --reload" in result.output


def test_app_dirs_are_where_the_targets_are_found(tmp_path: Path) -> None:
    """The app's directory: a package's own directory, a one-file module's directory, the
    current directory for a module not found; nested ones are watched once."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('not imported')\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "single.py").write_text("raise RuntimeError('not imported')\n")
    assert app_dirs(["pkg.sub.mod:W"], cwd=tmp_path) == [(tmp_path / "pkg").resolve()]
    assert app_dirs(["single:W"], cwd=tmp_path) == [tmp_path.resolve()]
    assert app_dirs(["nowhere_to_be_found:W"], cwd=tmp_path) == [tmp_path.resolve()]
    assert app_dirs(["pkg:W", "single:W"], cwd=tmp_path) == [tmp_path.resolve()]
    assert str(tmp_path) not in sys.path
