"""Least privilege with Redis ACLs, on a real server: each role runs as an ACL user holding
exactly the rules of docs/guides/security.md (read from the page, loaded as an aclfile so
they survive a restart), does its job and nothing more; a missing permission is reported
as one, naming the user, what was refused and what to grant (worker: a clear exit;
producer: PermissionDenied; CLI: one line, exit 1; dashboard: a 403 page).
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from starlette.testclient import TestClient

import streamwork as sw
from streamwork._cli.main import main
from streamwork._dashboard.app import DashboardSettings, create_app
from streamwork._redis import scripts
from streamwork._redis.acl import explain, script_commands
from streamwork._redis.faults import Fault, classify, is_transient
from streamwork._redis.server import RedisServer
from streamwork._wire.keys import StreamKeys
from streamwork._worker.core.consumer import Consumer
from streamwork._worker.core.loops.upkeep import upkeep_once
from streamwork._worker.features import FEATURES
from streamwork.testing import run_until_idle, wait_for
from tests.workers.acl import GROUP, STREAM, Limited, Orders, Partitioned, Staging

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guides" / "security.md"
WORKER_TARGET = "tests.workers.acl:Orders"
ADMIN = "user default on nopass ~* &* +@all"
#: what redis-py sends as it connects to Redis 7.2+/Valkey, refused without
#: +client|setinfo (which Redis 7.0 does not know) and ignored by redis-py
SETINFO = "client|setinfo"


def _blocks(prefix: str) -> list[str]:
    """The lines of the guide's ```text block whose every line starts with ``prefix``."""
    text = GUIDE.read_text(encoding="utf-8")
    for body in re.findall(r"```text\n(.*?)```", text, flags=re.S):
        lines = [line for line in body.splitlines() if line.strip()]
        if lines and all(line.startswith(prefix) for line in lines):
            return lines
    raise AssertionError(f"{GUIDE} has no ```text block of {prefix!r} lines")


ACLFILE = _blocks("user ")
SETUSER = _blocks("ACL SETUSER ")
PASSWORDS = {line.split()[1]: next(w[1:] for w in line.split() if w.startswith(">"))
             for line in ACLFILE}
WORKER, PRODUCER, VIEWER, OPERATOR = (
    "streamwork-worker", "streamwork-producer", "streamwork-viewer", "streamwork-operator")


def _words(line: str) -> list[str]:
    """An aclfile line's words, a selector ``(...)`` kept as one (as Redis reads it)."""
    return [w.strip() for w in re.findall(r"\([^)]*\)|\S+", line)]


def _rules_of(user: str) -> list[str]:
    """The rules (after ``user NAME``) of ``user`` in the guide's aclfile; a selector is
    one rule."""
    return next(_words(line)[2:] for line in ACLFILE if line.split()[1] == user)


class Acl:
    """A private server whose users are the guide's aclfile (plus an admin ``default``)."""

    def __init__(self, server: RedisServer, aclfile: Path) -> None:
        self.server = server
        self.aclfile = aclfile
        self.admin = redis.Redis.from_url(server.url)

    def url(self, user: str, password: str | None = None) -> str:
        return (f"redis://{user}:{password or PASSWORDS[user]}@127.0.0.1:"
                f"{self.server.port}/0")

    def add_user(self, user: str, rules: list[str]) -> str:
        """A further user (a role less one rule), set by the admin; its URL."""
        self.admin.execute_command("ACL", "SETUSER", user, "reset", *rules)
        return self.url(user, next(r[1:] for r in rules if r.startswith(">")))

    def refusals(self, user: str | None = None) -> list[dict[str, Any]]:
        """What ACL LOG recorded as refused (to ``user``), CLIENT SETINFO left out."""
        entries = self.admin.acl_log(count=200)
        return [e for e in entries if e.get("object") != SETINFO
                and (user is None or e.get("username") == user)]

    def cli(self, user: str, *args: str) -> Result:
        """``streamwork ARGS --url <user's URL>``, in this process."""
        return CliRunner(env={"REDIS_URL": None, "COLUMNS": "200"}).invoke(
            main, [*args, "--url", self.url(user)])


@pytest.fixture(name="acl")
def _acl(make_server: Callable[..., RedisServer], tmp_path: Path) -> Iterator[Acl]:
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("\n".join([ADMIN, *ACLFILE]) + "\n", encoding="utf-8")
    server = make_server(appendfsync="always", extra_args=["--aclfile", str(aclfile)])
    acl = Acl(server, aclfile)
    yield acl
    acl.admin.close()


def _work(acl: Acl) -> None:
    """Serve the stream in this process as streamwork-worker until its group is idle (the
    admin looks)."""
    asyncio.run(run_until_idle(Orders.from_url(acl.url(WORKER)), acl.admin))


def _status(url: str, key: str) -> sw.JobStatus:
    with sw.Producer.from_url(url) as producer:
        return producer.status(STREAM, key, group=GROUP)


def _denied(text: str, user: str, command: str | None = None) -> None:
    """``text`` says ``user`` was refused (``command``, where given) and what to do, in
    words, without a traceback."""
    assert f"Redis refused ACL user {user!r}" in text, text
    assert "retrying cannot help" in text and "security guide" in text, text
    assert "Traceback" not in text, text
    if command is not None:
        assert f"'{command}'" in text and f"ACL SETUSER {user} +{command}" in text, text


def _noted_refusal(text: str, user: str, command: str, script: str) -> None:
    """A refusal inside a script: Redis 7.2+/Valkey names the command, 7.0 only says a
    script was refused (the message then names the script and what it runs)."""
    _denied(text, user)
    named = f"the '{command}' command in streamwork's {script} script" in text
    unnamed = f"a command in streamwork's {script} script" in text and f"+{command}" in text
    assert named or unnamed, text


# ---------------------------------------------------------------- the guide's rules


def test_setuser_lines_grant_what_the_aclfile_grants(acl: Acl) -> None:
    """The guide's ACL SETUSER lines, sent by an admin, give every user the rules its
    aclfile line gives (ACL GETUSER of the aclfile's users equals that of the SETUSER's)."""
    for line in SETUSER:
        words = shlex.split(line)  # as redis-cli reads it: a quoted selector is one word
        name = words[2]
        acl.admin.execute_command("ACL", "SETUSER", f"copy-{name}", *words[3:])
        loaded = acl.admin.acl_getuser(name)
        copied = acl.admin.acl_getuser(f"copy-{name}")
        assert copied == loaded, name
    assert sorted(w.split()[2] for w in SETUSER) == sorted(PASSWORDS)


def test_each_kind_of_refusal_is_told_apart_and_fatal(acl: Acl) -> None:
    """What this server answers for a refused command, a refused key, and both inside a
    script, is a missing permission (never transient: nothing retries it), explained
    with the command or the stream, and the script it happened in."""
    url = acl.add_user("narrow", [">narrow-pw", "on", "~orders", "~{orders}:*",
                                  "+evalsha", "+script|load", "+get"])
    client = redis.Redis.from_url(url)
    runner = scripts.SyncScripts(client)
    try:
        seen: list[BaseException] = []
        for call in (lambda: client.set("orders", 1),
                     lambda: client.get("refunds"),
                     lambda: runner.run(scripts.produce(StreamKeys.for_stream("orders"),
                                                        [b"x"])),
                     lambda: runner.run(scripts.produce(StreamKeys.for_stream("refunds"),
                                                        [b"x"]))):
            with pytest.raises(redis.exceptions.ResponseError) as caught:
                call()
            seen.append(caught.value)
    finally:
        client.close()
    assert all(classify(exc) is Fault.FATAL and not is_transient(exc) for exc in seen)
    told = [explain(exc, url) for exc in seen]
    assert all(isinstance(t, sw.PermissionDenied) and t.user == "narrow" for t in told)
    command, key, in_script, key_in_script = (str(t) for t in told)
    assert "the 'set' command" in command and "ACL SETUSER narrow +set" in command
    assert "a key" in key and "streams it works on" in key  # no keys known: the rule
    assert "streamwork's produce script" in in_script and "+xadd" in in_script
    assert ("a key of stream 'refunds'" in key_in_script
            and "ACL SETUSER narrow ~refunds ~{refunds}:*" in key_in_script)


#: the Lua scripts each role runs (a worker's features included)
ROLE_SCRIPTS = {
    WORKER: ("ack", "adopt", "claim", "complete", "fail", "heartbeat", "promote", "read",
             "reclaim", "start", "tick", "trim", "reap", "rate", "semaphore", "chain",
             "join"),
    PRODUCER: ("produce", "schedule", "cancel", "join"),
    OPERATOR: ("replay", "cancel"),
}


def _commands_of(user: str, selectors: bool = True) -> set[str]:
    """The commands ``user`` is granted (with ``selectors``: also those its selectors
    grant on some of its keys)."""
    rules = _rules_of(user)
    if selectors:
        rules += [w for r in rules if r.startswith("(") for w in r.strip("()").split()]
    return {r[1:] for r in rules if r.startswith("+")}


def test_each_role_is_granted_every_command_its_scripts_run(acl: Acl) -> None:
    """Every command of every script a role runs is among its rules (a script that gains
    a command fails here, even for a feature the other tests do not run); the viewer's
    commands are none of the server's write commands (the operator's writes are its
    actions'), and the producer holds none that acknowledges, deletes or trims."""
    for user, names in ROLE_SCRIPTS.items():
        granted = _commands_of(user)
        for name in names:
            missing = set(script_commands(name)) - granted
            assert not missing, f"{user} lacks {sorted(missing)} for the {name} script"
    writes = {c.decode() if isinstance(c, bytes) else c for c in acl.admin.acl_cat("write")}
    assert {"hset", "xadd", "xgroup|create"} <= writes  # the server's own list
    assert not _commands_of(VIEWER) & writes
    assert _commands_of(OPERATOR) & writes == {"hset", "del", "xadd", "xdel", "xtrim", "set"}
    assert not {"xack", "xdel", "del", "unlink", "xtrim", "xgroup|destroy", "eval"} & \
        _commands_of(PRODUCER)


# ---------------------------------------------------------------- the worker


def test_worker_runs_as_its_user_through_a_restart_and_a_reclaim(
        acl: Acl, spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """A worker as streamwork-worker does its jobs (also a retried one and a dead letter),
    rides out a Redis restart (its user comes back from the aclfile), and a second worker
    as the same user reclaims the delivery the first one held when it was killed; the
    producer sends and reads status as streamwork-producer; nothing was refused."""
    w_url, p_url = acl.url(WORKER), acl.url(PRODUCER)
    with sw.Producer.from_url(p_url) as producer:
        for i in range(10):
            producer.send(STREAM, {"n": i}, key=f"a{i}")
        producer.send(STREAM, {"n": 100}, key="later", delay=0.3)
        producer.send(STREAM, {"n": 101}, key="urgent", priority="high")
        producer.send(STREAM, {"fail": True}, key="declined")
    first = spawn_worker(WORKER_TARGET, w_url)
    wait_for(lambda: all(_status(p_url, k).state == "done"
                         for k in [*(f"a{i}" for i in range(10)), "later", "urgent"]),
             timeout=30, message="the first jobs done")
    wait_for(lambda: _status(p_url, "declined").state == "dead", timeout=30,
             message="the failing job dead-lettered")

    acl.server.restart()  # AOF always: the jobs stay; the aclfile: the users stay
    with sw.Producer.from_url(p_url) as producer:
        for i in range(5):
            producer.send(STREAM, {"n": i}, key=f"b{i}")
        producer.send(STREAM, {"hang": True, "n": 7}, key="held")
    wait_for(lambda: all(_status(p_url, f"b{i}").state == "done" for i in range(5)),
             timeout=30, message="the jobs sent after the restart done")
    wait_for(lambda: _status(p_url, "held").state == "running", timeout=30,
             message="the first worker to run the hanging job")
    assert first.poll() is None, "the first worker exited"
    os.kill(first.pid, signal.SIGKILL)
    first.wait()

    second = spawn_worker(WORKER_TARGET, w_url)
    held = wait_for(lambda: (s := _status(p_url, "held")).state == "done" and s, timeout=30,
                    message="the second worker to reclaim and finish the held job")
    assert held.attempts == 2 and held.result == 7
    assert second.poll() is None, "the second worker exited"
    for key, n in [("a3", 3), ("b4", 4), ("urgent", 101)]:
        with sw.Producer.from_url(p_url) as producer:
            assert producer.result(STREAM, key, group=GROUP, timeout=5) == n
    assert acl.refusals() == []


def test_worker_without_a_permission_exits_at_start_saying_what_to_grant(
        acl: Acl, spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """Run as the viewer (no +eval, no writes), a worker does not start: it exits 1 at
    once with one message naming the user, the command and the grant, no traceback, and
    no outage retried."""
    proc = spawn_worker(WORKER_TARGET, acl.url(VIEWER), stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    text = out.decode()
    assert proc.returncode == 1, text
    _denied(text, VIEWER, "eval")
    assert "WorkerFailed: worker stopped: Redis refused its start a permission" in text
    assert "unavailable" not in text


@pytest.mark.parametrize(("dropped", "loop", "script"), [
    ("xack", "flusher", "complete"),       # the ack path: complete.lua's XACK
    ("xreadgroup", "reader", None),        # the read path
    ("zrangebyscore", "promoter", "promote"),  # an upkeep loop (delayed sends, retries)
])
def test_worker_missing_a_permission_in_a_loop_exits_whole(
        acl: Acl, spawn_worker: Callable[..., subprocess.Popen[bytes]],
        dropped: str, loop: str, script: str | None) -> None:
    """A worker whose user lacks one command it needs in one of its loops (the
    acknowledgement, the read, the promoter) stops as a whole, with one ERROR line and
    exit 1 naming the loop, the user and what to grant; no traceback, no backoff. What
    it held stays pending, and the worker with the full rules finishes it."""
    user = f"worker-no-{dropped}"
    url = acl.add_user(user, [*_rules_of(WORKER), f"-{dropped}"])
    with sw.Producer.from_url(acl.url(PRODUCER)) as producer:
        producer.send(STREAM, {"n": 1}, key="one")
    proc = spawn_worker(WORKER_TARGET, url, stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    text = out.decode()
    assert proc.returncode == 1, text
    assert f"{loop} failed; the worker stops" in text, text
    assert f"Redis refused its {loop} a permission" in text, text
    if script is None:
        _denied(text, user, dropped)
    else:
        _noted_refusal(text, user, dropped, script)
    assert "redis unavailable" not in text
    done = spawn_worker(WORKER_TARGET, acl.url(WORKER))
    wait_for(lambda: _status(acl.url(PRODUCER), "one").state == "done", timeout=30,
             message="the full worker to finish the job")
    assert done.poll() is None


async def _serve_until(worker: sw.StreamWorker, done: Callable[[], bool],
                       timeout: float = 30) -> None:
    """Serve ``worker`` in this process until ``done()`` (asked in a thread), then stop it
    (it must not have stopped on its own)."""
    task = asyncio.create_task(worker.serve())
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while not await asyncio.to_thread(done):
            assert not task.done(), task.result()
            assert asyncio.get_running_loop().time() < deadline, "timed out"
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await task


def test_worker_rules_cover_limits_schedules_joins_pause_upkeep_and_partitions(acl: Acl) -> None:
    """The worker's (and the producer's) rules are enough for a rate limit, a cap per
    concurrency key, a schedule, a join (send_join, its callback reading the children's
    results, join_status), a pause and resume (by the operator), upkeep (trim and reap),
    and, with the guide's patterns for partitions added, an ordered worker on a
    partitioned stream; nothing is refused."""
    p_url, w_url = acl.url(PRODUCER), acl.url(WORKER)
    gkeys = StreamKeys.for_stream(STREAM).group(GROUP)
    with sw.Producer.from_url(p_url) as producer:
        for i in range(12):
            producer.send(STREAM, {"n": i, "customer": f"c{i % 3}"}, key=f"l{i}")
        join = producer.send_join([sw.Job(STREAM, {"n": 2}), sw.Job(STREAM, {"n": 3})],
                                  then=sw.Job(STREAM, {"join": True}, key="j-callback"))

    def all_done() -> bool:
        return (all(_status(p_url, f"l{i}").state == "done" for i in range(12))
                and _status(p_url, "j-callback").state == "done"
                and acl.admin.exists(gkeys.tick("tick")) == 1)

    asyncio.run(_serve_until(Limited.from_url(w_url), all_done))
    with sw.Producer.from_url(p_url) as producer:
        assert producer.result(STREAM, "j-callback", group=GROUP, timeout=5) == 5
        assert producer.join_status(STREAM, join, results=True).state == "fired"
    assert acl.cli(OPERATOR, "pause", STREAM, "--group", GROUP).exit_code == 0
    with sw.Producer.from_url(p_url) as producer:
        producer.send(STREAM, {"n": 99, "customer": "c0"}, key="after-pause")

    async def paused_then_resumed() -> None:
        worker = Limited.from_url(w_url)
        task = asyncio.create_task(worker.serve())
        try:
            await asyncio.sleep(1.5)  # it reads the pause (and the server's run_id)
            assert _status(p_url, "after-pause").state != "done"
            resumed = await asyncio.to_thread(acl.cli, OPERATOR, "resume", STREAM,
                                              "--group", GROUP)
            assert resumed.exit_code == 0, resumed.stderr
            while _status(p_url, "after-pause").state != "done":
                assert not task.done(), task.result()
                await asyncio.sleep(0.05)
        finally:
            worker.stop()
            await task

    asyncio.run(paused_then_resumed())

    async def upkeep() -> tuple[int, int]:
        worker = Limited.from_url(w_url)
        consumer = Consumer(worker.handle, worker.config, w_url, "upkeeper",
                            features=FEATURES)
        try:
            await consumer._join()
            return await upkeep_once(consumer.ctx)
        finally:
            await consumer.redis.aclose()

    trimmed, reaped = asyncio.run(upkeep())
    assert trimmed > 0 and reaped > 0

    def partitioned(role: str) -> str:
        """A user with ``role``'s rules and the guide's patterns for partitions."""
        rules = [re.sub(r"^>.*", ">parts-secret", r) for r in _rules_of(role)]
        return acl.add_user(f"parts-{role}", [*rules, "~orders#*", "~{orders#*}:*"])

    parts_worker = partitioned(WORKER)
    parts_producer = partitioned(PRODUCER)
    with sw.Producer.from_url(parts_producer, partitions=2) as producer:
        for i in range(8):
            producer.send(STREAM, {"n": i}, key=f"p{i}", order_key=f"o{i % 2}")

    def parts_done() -> bool:
        with sw.Producer.from_url(parts_producer, partitions=2) as producer:
            return all(producer.status(STREAM, f"p{i}", group=GROUP).state == "done"
                       for i in range(8))

    asyncio.run(_serve_until(Partitioned.from_url(parts_worker), parts_done))
    assert acl.refusals() == []


def test_a_staged_write_the_user_may_not_make_is_rejected_like_any(
        acl: Acl, caplog: pytest.LogCaptureFixture) -> None:
    """A handler's staged write whose command the worker's user lacks (RPUSH) is what the
    guide says: handled as any staged write Redis rejects, the job acknowledged and an
    ERROR logged; with +rpush granted it is applied."""
    with sw.Producer.from_url(acl.url(PRODUCER)) as producer:
        producer.send(STREAM, {"n": 1}, key="s1")
    asyncio.run(run_until_idle(Staging.from_url(acl.url(WORKER)), acl.admin))
    assert _status(acl.url(PRODUCER), "s1").state == "done"
    assert "a staged write was rejected by Redis" in caplog.text
    assert not acl.admin.exists("{orders}:seen")
    acl.admin.execute_command("ACL", "SETUSER", WORKER, "+rpush")
    with sw.Producer.from_url(acl.url(PRODUCER)) as producer:
        producer.send(STREAM, {"n": 2}, key="s2")
    asyncio.run(run_until_idle(Staging.from_url(acl.url(WORKER)), acl.admin))
    assert acl.admin.lrange("{orders}:seen", 0, -1) == [b"s2"]


# ---------------------------------------------------------------- the producer


def test_producer_sends_and_reads_status_but_cannot_ack_delete_or_trim(acl: Acl) -> None:
    """streamwork-producer sends (plain, delayed, with a priority), reads status and
    results and cancels; XACK, XDEL, DEL, XTRIM, a group's destruction and a pause are
    refused, the last as PermissionDenied naming hset."""
    p_url = acl.url(PRODUCER)
    with sw.Producer.from_url(p_url) as producer:
        producer.send(STREAM, {"n": 1}, key="k1")
        producer.send(STREAM, {"n": 2}, key="k2", delay=0.05)
        producer.send(STREAM, {"n": 3}, key="k3", priority="low")
        producer.send(STREAM, {"n": 4}, key="k4")
        assert producer.cancel(STREAM, "k4", group=GROUP) == "unknown"  # not read yet
    _work(acl)
    with sw.Producer.from_url(p_url) as producer:
        assert producer.status(STREAM, "k1", group=GROUP).state == "done"
        assert producer.result(STREAM, "k2", group=GROUP, timeout=5) == 2
        assert producer.result(STREAM, "k3", group=GROUP, timeout=5) == 3
        assert producer.status(STREAM, "k4", group=GROUP).state == "cancelled"
        with pytest.raises(sw.PermissionDenied) as refused:
            producer.pause(STREAM, GROUP, reason="not mine to pause")
        _denied(str(refused.value), PRODUCER, "hset")
        assert refused.value.user == PRODUCER and refused.value.command == "hset"
    keys = StreamKeys.for_stream(STREAM)
    entry = acl.admin.xrange(STREAM, count=1)[0][0]
    raw = redis.Redis.from_url(p_url)
    try:
        for call in (lambda: raw.xack(STREAM, GROUP, entry), lambda: raw.xdel(STREAM, entry),
                     lambda: raw.delete(keys.group(GROUP).job("k1")),
                     lambda: raw.xtrim(STREAM, maxlen=0),
                     lambda: raw.xgroup_destroy(STREAM, GROUP),
                     lambda: raw.eval("return 1", 0)):
            with pytest.raises(redis.exceptions.NoPermissionError):
                call()
    finally:
        raw.close()
    assert acl.admin.xlen(STREAM) >= 3 and acl.admin.exists(keys.group(GROUP).job("k1"))


def test_producer_refused_a_key_names_the_stream_and_its_patterns(acl: Acl) -> None:
    """Sending to a stream outside the producer's patterns raises PermissionDenied naming
    the stream and the key patterns to grant."""
    with sw.Producer.from_url(acl.url(PRODUCER)) as producer, \
            pytest.raises(sw.PermissionDenied) as refused:
        producer.send("refunds", {"n": 1})
    _denied(str(refused.value), PRODUCER)
    text = str(refused.value)
    assert "a key of stream 'refunds'" in text and "~refunds ~{refunds}:*" in text, text
    assert f"ACL SETUSER {PRODUCER} " in text


# ---------------------------------------------------------------- operators


@pytest.fixture(name="worked")
def _worked(acl: Acl) -> Acl:
    """The stream after a worker ran: one job done, one dead letter."""
    with sw.Producer.from_url(acl.url(PRODUCER)) as producer:
        producer.send(STREAM, {"n": 5}, key="paid")
        producer.send(STREAM, {"fail": True}, key="declined")
    _work(acl)
    assert acl.admin.xlen(StreamKeys.for_stream(STREAM).dead) == 1
    return acl


def test_viewer_reads_everything_but_cannot_pause_replay_or_purge(worked: Acl) -> None:
    """streamwork-viewer runs inspect, top, job, dlq list and schedules; pause, resume,
    dlq replay, dlq purge and cancel each exit 1 with one line naming the refused command
    and what to grant, and change nothing."""
    acl = worked
    for args, shows in [(("inspect",), GROUP), (("inspect", STREAM), GROUP),
                        (("top", "--once"), GROUP),
                        (("job", STREAM, "paid", "--group", GROUP), "done"),
                        (("dlq", "list", STREAM), "card declined"),
                        (("schedules", STREAM), "no schedules")]:
        done = acl.cli(VIEWER, *args)
        assert done.exit_code == 0 and shows in done.stdout, (args, done.stdout, done.stderr)
    for args, command in [(("pause", STREAM, "--group", GROUP), "hset"),
                          (("resume", STREAM, "--group", GROUP), "del"),
                          (("dlq", "replay", STREAM, "--all"), "evalsha"),
                          (("dlq", "purge", STREAM, "--yes"), "xtrim"),
                          (("cancel", STREAM, "paid", "--group", GROUP), "evalsha")]:
        refused = acl.cli(VIEWER, *args)
        assert refused.exit_code == 1, (args, refused.stdout, refused.stderr)
        _denied(refused.stderr, VIEWER, command)
    keys = StreamKeys.for_stream(STREAM)
    assert acl.admin.xlen(keys.dead) == 1
    assert not acl.admin.exists(keys.group(GROUP).paused)
    assert {e["object"] for e in acl.refusals(VIEWER)} == {"evalsha", "xtrim", "del", "hset"}

    # another stream on the server: inspect without STREAM looks at it too, refused a key;
    # the guide's short form for every stream, read-only keys on all (%R~*), sees both
    acl.admin.xadd("refunds", {"x": "1"})
    refused = acl.cli(VIEWER, "inspect")
    assert refused.exit_code == 1 and "a key" in refused.stderr, refused.output
    _denied(refused.stderr, VIEWER)
    rules = [r for r in _rules_of(VIEWER) if not r.startswith("~")]
    acl.add_user("viewer-all", [r.replace(">viewer-secret", ">all-secret") for r in rules]
                 + ["%R~*"])
    seen = CliRunner(env={"REDIS_URL": None, "COLUMNS": "200"}).invoke(
        main, ["inspect", "--url", acl.url("viewer-all", "all-secret")])
    assert seen.exit_code == 0 and "refunds" in seen.stdout and GROUP in seen.stdout, \
        seen.output


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF token on the page"
    return found.group(1)


def _dashboard(url: str) -> TestClient:
    settings = DashboardSettings(url, refresh_s=0, sample_interval_s=0.2)
    return TestClient(create_app(settings), base_url="http://127.0.0.1")


def test_viewer_sees_the_dashboard_but_its_actions_are_refused(worked: Acl) -> None:
    """The dashboard as streamwork-viewer shows the stream, its dead letter and a job
    lookup; pause, replay and purge answer 403 saying what Redis refused and what to
    grant, and change nothing."""
    acl = worked
    keys = StreamKeys.for_stream(STREAM)
    dead_id = acl.admin.xrange(keys.dead)[0][0].decode()
    with _dashboard(acl.url(VIEWER)) as http:
        page = http.get("/")
        assert page.status_code == 200 and STREAM in page.text and "card declined" in page.text
        job = http.get("/", params={"job_stream": STREAM, "job_key": "paid",
                                    "job_group": GROUP})
        assert job.status_code == 200 and "done" in job.text
        csrf = _csrf(page.text)
        for path, form, command in [
                ("/group/pause", {"stream": STREAM, "group": GROUP, "reason": "x"}, "hset"),
                ("/dlq/replay", {"stream": STREAM, "id": dead_id}, "evalsha"),
                ("/dlq/purge", {"stream": STREAM, "confirm": "yes"}, "xtrim")]:
            answer = http.post(path, data={**form, "csrf": csrf}, follow_redirects=False)
            assert answer.status_code == 403, (path, answer.text)
            text = html.unescape(answer.text)
            assert "refused this" in text
            _denied(text, VIEWER, command)
    assert acl.admin.xlen(keys.dead) == 1
    assert not acl.admin.exists(keys.group(GROUP).paused)


def test_operator_pauses_replays_purges_and_cancels(worked: Acl) -> None:
    """streamwork-operator may act: pause and resume, replay and purge dead letters (CLI
    and dashboard) and cancel; nothing it does is refused."""
    acl = worked
    keys = StreamKeys.for_stream(STREAM)
    for args, says in [(("pause", STREAM, "--group", GROUP), "paused"),
                       (("resume", STREAM, "--group", GROUP), "resumed"),
                       (("dlq", "replay", STREAM, "--all"), "replayed 1"),
                       (("cancel", STREAM, "nope", "--group", GROUP), "will not run")]:
        done = acl.cli(OPERATOR, *args)
        assert done.exit_code == 0 and says in done.stdout, (args, done.stdout, done.stderr)
    _work(acl)  # the replayed job dies again: a dead letter to purge
    assert acl.admin.xlen(keys.dead) == 1
    with _dashboard(acl.url(OPERATOR)) as http:
        csrf = _csrf(http.get("/").text)
        paused = http.post("/group/pause", data={"stream": STREAM, "group": GROUP,
                                                 "reason": "audit", "csrf": csrf},
                           follow_redirects=False)
        assert paused.status_code == 303
        purged = http.post("/dlq/purge", data={"stream": STREAM, "confirm": "yes",
                                               "csrf": csrf}, follow_redirects=False)
        assert purged.status_code == 303 and "n=1" in purged.headers["location"]
    assert acl.admin.xlen(keys.dead) == 0 and acl.admin.exists(keys.group(GROUP).paused)
    done = acl.cli(OPERATOR, "dlq", "purge", STREAM, "--yes")
    assert done.exit_code == 0, done.stderr
    assert acl.refusals() == []
