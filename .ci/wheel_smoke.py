"""Run by .ci/check-wheel with the python of a fresh venv that has only the built wheel
(and its `embedded` and `dashboard` extras), from an empty temporary directory.

Usage: python -I wheel_smoke.py WHEEL SOURCE_ROOT

Checks, in order, each printing one "check-wheel: ok: ..." line or ending the script
with status 1 and what went wrong:

1. ``import streamwork`` is the venv's copy (no source tree on sys.path);
2. the wheel has every file of the source package (Lua scripts, templates, py.typed...)
   and the demo's scenario;
3. ``streamwork --version`` prints ``streamwork VERSION`` (the wheel's version);
4. the dashboard's templates load from the installed package;
5. ``streamwork demo`` bills its orders (on $REDIS_URL, 127.0.0.1:6379, or a server of
   its own, as it says);
6. ``streamwork run`` serves a worker module written here: a job sent to it is handled,
   then SIGTERM to its pid stops it with status 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL, ROOT = Path(sys.argv[1]), Path(sys.argv[2])
HERE = Path.cwd()
BIN = Path(sys.executable).parent
STREAMWORK = str(BIN / "streamwork")
VERSION = WHEEL.name.split("-")[1]

WORKER = '''\
import os

import streamwork as sw


class Echo(sw.StreamWorker):
    stream = "wheel-check"
    group = "smoke"

    async def handle(self, msg: sw.Message) -> dict[str, object]:
        return {"n": msg.payload["n"], "file": __file__, "pid": os.getpid()}
'''


def ok(what: str) -> None:
    print(f"check-wheel: ok: {what}", flush=True)


def fail(what: str, output: str = "") -> None:
    if output:
        print(output[-6000:], file=sys.stderr)
    sys.exit(f"check-wheel: FAILED: {what}")


def run(*args: str, timeout: float, env: dict[str, str] | None = None) -> str:
    """Run a command to its end; its output, or a failure naming it."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                              env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        fail(f"{' '.join(args)} did not finish in {timeout:g} s", str(exc.stdout or ""))
    if done.returncode != 0:
        fail(f"{' '.join(args)} exited {done.returncode}", done.stdout + done.stderr)
    return done.stdout


def check_import() -> None:
    import streamwork

    where = Path(streamwork.__file__).resolve()
    if not where.is_relative_to(Path(sys.prefix).resolve()):
        fail(f"streamwork was imported from {where}, not from the venv {sys.prefix}")
    if any(Path(p or ".").resolve() == ROOT for p in sys.path):
        fail(f"the source tree {ROOT} is on sys.path: {sys.path}")
    ok(f"streamwork imported from {where.parent}")


def check_wheel_files() -> None:
    names = set(zipfile.ZipFile(WHEEL).namelist())
    source = {p.relative_to(ROOT).as_posix() for p in (ROOT / "streamwork").rglob("*")
              if p.is_file() and "__pycache__" not in p.parts}
    missing = sorted(source - names)
    if missing:
        fail(f"the wheel lacks files of the source package: {missing}")
    if "streamwork/_cli/demo_scenario.py" not in names:
        fail("the wheel lacks the demo's scenario (streamwork/_cli/demo_scenario.py)")
    lua = sum(1 for n in names if n.endswith(".lua"))
    ok(f"the wheel has all {len(source)} files of the package ({lua} Lua scripts) and the "
       "demo's scenario")


def check_version() -> None:
    printed = run(STREAMWORK, "--version", timeout=60).strip()
    if printed != f"streamwork {VERSION}":
        fail(f"`streamwork --version` printed {printed!r}, not 'streamwork {VERSION}'")
    ok(f"`streamwork --version`: {printed}")


def check_templates() -> None:
    from streamwork._dashboard.app import _templates

    templates = _templates()
    for name in ("base.html", "index.html", "error.html"):
        templates.get_template(name)
    ok("the dashboard's templates load from the installed package")


def check_demo() -> None:
    out = run(STREAMWORK, "demo", "--orders", "300", timeout=300)
    if "OK: every order charged once or dead-lettered" not in out:
        fail("`streamwork demo` did not end with its OK line", out)
    ok(f"`streamwork demo`: {out.strip().splitlines()[0][:100]}")


def check_worker() -> None:
    import streamwork as sw
    from streamwork.testing import RedisServer

    (HERE / "smoke_worker.py").write_text(WORKER)
    log = (HERE / "worker.log").open("w+")
    with RedisServer() as server:
        proc = subprocess.Popen([STREAMWORK, "run", "smoke_worker:Echo", "--url", server.url],
                                cwd=HERE, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            with sw.Producer.from_url(server.url) as producer:
                producer.send("wheel-check", {"n": 7}, key="job-7")
                try:
                    result = producer.result("wheel-check", "job-7", group="smoke",
                                             timeout=60)
                except Exception as exc:
                    log.seek(0)
                    fail(f"the worker did not handle the job: {exc!r}", log.read())
            if result != {"n": 7, "file": str(HERE / "smoke_worker.py"), "pid": proc.pid}:
                fail(f"the job's result is {result!r}")
            os.kill(proc.pid, signal.SIGTERM)
            try:
                status = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                fail("`streamwork run` did not stop within 60 s of SIGTERM")
            if status != 0:
                log.seek(0)
                fail(f"`streamwork run` exited {status} after SIGTERM", log.read())
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    ok(f"`streamwork run` handled a job (pid {proc.pid}) and stopped on SIGTERM")


def main() -> None:
    os.environ.pop("PYTHONPATH", None)  # nor for the commands started here
    check_import()
    check_wheel_files()
    check_version()
    check_templates()
    check_demo()
    check_worker()


if __name__ == "__main__":
    main()
