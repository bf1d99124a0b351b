"""The examples run as documented (each starts its own private redis-server), use only the
public API, are all listed in examples/README.md; the demo says which Redis it uses and
touches only its own keys there."""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from streamwork.testing import RedisServer, free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py") if p.name != "__init__.py")
#: scripts not run by test_example_script_runs, and why
RUN_ELSEWHERE = {
    "demo.py": "the demo tests below",
    "fastapi_app.py": "test_fastapi_app_enqueues_and_its_worker_handles",
    "otel_otlp.py": "needs an OTLP collector",
}
DEMO_KEYS = re.compile(r"The demo touches only its own keys \((demo-orders-[0-9a-f]{8}), "
                       r"\{\1\}:\*\)")


def _run(*args: str, env: dict[str, str] | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python args...`` in the repository, its output captured (rich: 120 columns)."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False,
                          env={**os.environ, "COLUMNS": "120", **(env or {})})


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s not in RUN_ELSEWHERE])
def test_example_script_runs(name: str) -> None:
    """Each example script exits 0 on its own private server."""
    proc = _run(str(EXAMPLES / name), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _private_uses(path: Path) -> list[str]:
    """What ``path`` takes from streamwork's private modules: imports of ``streamwork._x``
    (or of ``_x`` from ``streamwork``) and ``streamwork._x`` attribute accesses."""
    def private(dotted: str) -> bool:
        parts = dotted.split(".")
        return parts[0] == "streamwork" and any(
            p.startswith("_") and not p.endswith("__") for p in parts[1:])

    found: list[str] = []
    aliases: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if private(alias.name):
                    found.append(f"line {node.lineno}: import {alias.name}")
                elif alias.name.split(".")[0] == "streamwork":
                    aliases.add(alias.asname or "streamwork")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if private(f"{node.module}.{alias.name}"):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and private(f"streamwork.{node.attr}")):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("name", SCRIPTS)
def test_example_uses_only_the_public_api(name: str) -> None:
    """An example is code to copy: it imports nothing from streamwork's private modules
    (``streamwork.testing`` has RedisServer, free_port, wait_for)."""
    assert _private_uses(EXAMPLES / name) == [], f"examples/{name} uses private modules"


def test_private_use_check_catches_each_form(tmp_path: Path) -> None:
    """The check above sees the forms a private use takes, and passes public ones."""
    bad = tmp_path / "bad.py"
    bad.write_text("import streamwork as sw\nimport streamwork._wire.keys\n"
                   "from streamwork._redis.server import RedisServer\n"
                   "from streamwork import _wire\n"
                   "x = sw._producer\n")
    assert len(_private_uses(bad)) == 4, _private_uses(bad)
    good = tmp_path / "good.py"
    good.write_text("import streamwork as sw\nfrom streamwork.testing import RedisServer\n"
                    "from streamwork.errors import DeadLetter\nx = sw.__version__, sw.Producer\n")
    assert _private_uses(good) == []


@pytest.mark.parametrize("name", [*SCRIPTS, "alerts/"])
def test_example_is_listed_in_the_examples_readme(name: str) -> None:
    """examples/README.md has a row for every example (its name in backquotes)."""
    listed = re.findall(r"^\| `([^`]+)` \|", (EXAMPLES / "README.md").read_text(), re.M)
    assert name in listed, f"examples/README.md has no row for {name}"


def test_billing_example_charges_each_order_once() -> None:
    """The fenced-billing example charges o-1 once although it was enqueued twice."""
    proc = _run(str(EXAMPLES / "billing_dedup.py"), timeout=60)
    lines = [ln for ln in proc.stdout.splitlines() if "charged" in ln]
    assert len(lines) == 3 and all("once" in ln for ln in lines), proc.stdout


def test_fastapi_app_enqueues_and_its_worker_handles(redis_url: str, monkeypatch: Any) -> None:
    """The FastAPI example enqueues from a route and its lifespan worker mails it once."""
    from fastapi.testclient import TestClient

    import examples.fastapi_app as app_module

    monkeypatch.setattr(app_module, "REDIS_URL", redis_url)
    app_module.Receipts.sent = []
    with TestClient(app_module.app) as client:
        for _ in range(2):  # a double click
            assert client.post("/orders/7/receipt").status_code == 200
        wait_for(lambda: client.get("/receipts/sent").json() == ["receipt-7"], 20,
                 message="the receipt to be sent")
    assert app_module.Receipts.sent == ["receipt-7"]


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def _assert_demo_ok(out: str, orders: int) -> None:
    assert re.search(rf"orders\s*│\s*{orders}\b", out), out
    for line in ("orders charged twice", "left pending"):
        assert re.search(rf"{line}\s*│\s*0\b", out), out
    assert "OK: every order charged once or dead-lettered" in out, out


def test_demo_first_line_names_the_private_server_it_started() -> None:
    """With nothing at the URL the demo's first line says it uses a private server it
    started (URL, binary) and which keys it touches; the second says why; the server is
    gone afterwards."""
    dead_port = free_port()
    dead = f"redis://127.0.0.1:{dead_port}/0"
    proc = _run(str(EXAMPLES / "demo.py"), dead, "--orders", "300")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = proc.stdout.splitlines()[:2]
    used = re.match(r"Using Redis at redis://127\.0\.0\.1:(\d+)/0 \(a private "
                    r"(redis-server|valkey-server) the demo started: (\S+); it stops it at "
                    r"the end\)\. ", first)
    assert used, first
    assert DEMO_KEYS.search(first), first
    assert Path(used.group(3)).name == used.group(2)
    assert int(used.group(1)) != dead_port
    assert second.startswith(f"Nothing usable answered at {dead} ("), second
    _assert_demo_ok(proc.stdout, 300)
    assert _port_closed(int(used.group(1))), "the demo's private server was left running"


def _watch_keys(url: str) -> tuple[Callable[[], set[str]], Callable[[], None]]:
    """Start recording the name of every key a command touches on the server at ``url``
    (keyspace notifications); return (stop and give the names, cancel)."""
    client = redis.Redis.from_url(url)
    client.config_set("notify-keyspace-events", "KA")
    pubsub = client.pubsub()
    pubsub.psubscribe("__keyspace@0__:*")
    touched: set[str] = set()
    sentinel = "test-examples-sentinel"
    ready, done = threading.Event(), threading.Event()

    def listen() -> None:
        for message in pubsub.listen():
            if message["type"] == "psubscribe":
                ready.set()
            if message["type"] != "pmessage":
                continue
            key = message["channel"].decode(errors="replace").split(":", 1)[1]
            if key == sentinel:
                done.set()
                return
            touched.add(key)

    threading.Thread(target=listen, daemon=True).start()
    assert ready.wait(30), "the subscription to keyspace notifications was not confirmed"

    def finish() -> set[str]:
        client.set(sentinel, 1)  # notifications arrive in order: after it, there is none left
        assert done.wait(30), "the sentinel's notification never came"
        client.delete(sentinel)
        cancel()
        return touched

    def cancel() -> None:
        pubsub.close()
        client.close()

    return finish, cancel


def test_demo_on_a_running_server_touches_only_its_own_keys(
        make_server: Callable[..., RedisServer]) -> None:
    """Given a server that answers ($REDIS_URL here) and holds other data, the demo says so
    on its first line, names its keys, touches no other key and leaves the server's data
    as it found it."""
    url = make_server().url
    r = redis.Redis.from_url(url)
    r.set("orders", "someone else's string")
    r.xadd("demo-orders", {"a": "1"})
    r.xgroup_create("demo-orders", "billing", id="0")
    r.hset("{demo-orders}:dead", "x", "1")
    before = {k: r.dump(k) for k in r.scan_iter()}
    finish, cancel = _watch_keys(url)
    try:
        proc = _run(str(EXAMPLES / "demo.py"), "--orders", "300", env={"REDIS_URL": url})
        touched = finish()
    except BaseException:
        cancel()
        raise
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"Using Redis at {url} (already running; not started by the "
                            "demo). "), first
    own = DEMO_KEYS.search(first)
    assert own and first.endswith("and deletes them at the end."), first
    stream = own.group(1)
    assert stream in touched, touched
    strangers = {k for k in touched if k != stream and not k.startswith(f"{{{stream}}}:")}
    assert not strangers, f"the demo touched keys not its own: {strangers}"
    assert {k: r.dump(k) for k in r.scan_iter()} == before
    _assert_demo_ok(proc.stdout, 300)
    r.close()


def test_streamwork_demo_without_the_examples_says_what_to_do(
        tmp_path: Path, monkeypatch: Any) -> None:
    """`streamwork demo` where examples/demo.py is absent (an install from a wheel) exits 1
    with a message naming the file and `make demo`, not a traceback."""
    from click.testing import CliRunner

    from streamwork._cli import demo as _demo
    from streamwork._cli.main import main

    monkeypatch.setattr(_demo, "EXAMPLE", tmp_path / "demo.py")
    monkeypatch.delitem(sys.modules, _demo._MODULE, raising=False)
    result = CliRunner().invoke(main, ["demo", "--url", f"redis://127.0.0.1:{free_port()}/0"])
    assert result.exit_code == 1, result.output
    assert f"{tmp_path / 'demo.py'} is missing" in result.output
    assert "make demo" in result.output
