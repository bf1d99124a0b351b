"""The CLI's rough edges, each against a real server: `dlq list` at 80 columns and its
lossless JSON, error tracebacks cut at line boundaries (`job`, `JobFailed`), `top` into a
pipe, `send --partitions/--order-key`, option defaults and help, the `none` forms, and the
worker's stop line."""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import click
import pytest
import redis
from click.testing import CliRunner, Result

import streamwork as sw
from streamwork._cli.main import main
from streamwork._telemetry.logs import WORKER_LOGGER, TextFormatter
from streamwork._wire.codec import BODY_FIELD, decode_body
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names, partition_of
from streamwork._worker.config import WorkerConfig
from streamwork.testing import run_until_idle, wait_for

ROOT = Path(__file__).resolve().parent.parent
STREAM, GROUP = "polish", "billing"
DEAD = StreamKeys.for_stream(STREAM).dead

LONG_KEY = "customer-4711/invoice-2024-0001-monthly-renewal"
LONG_REASON = "the card issuer refused the charge because the account was closed"
LONG_ERROR = ("the payment gateway answered 502 Bad Gateway three times in a row while "
              "charging the customer's card for the monthly renewal")


def cli(*args: str, columns: int = 250, input: str | None = None) -> Result:
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(main, list(args), input=input)


def _deep(n: int, message: str) -> None:
    """Raise ValueError(message) ``n`` calls deep: a traceback of many lines."""
    if n:
        _deep(n - 1, message)
    raise ValueError(message)


class PolishWorker(sw.StreamWorker):
    """Behaves as the payload says: ``dead`` (DeadLetter with that reason), ``raise``
    (ValueError with that message, from deep down), ``fail_once`` (fails attempt 1)."""

    stream = STREAM
    group = GROUP
    concurrency = 4
    max_deliveries = 2
    retry_delay = 0.05
    retry_max_delay = 0.1
    read_block = 0.05
    reclaim_interval = 0.2
    drain_timeout = 5.0

    async def handle(self, msg: sw.Message) -> str:
        p: dict[str, Any] = msg.payload if isinstance(msg.payload, dict) else {}
        if "dead" in p:
            raise sw.DeadLetter(p["dead"])
        if "raise" in p:
            _deep(12, p["raise"])
        if p.get("fail_once") and msg.attempt == 1:
            raise RuntimeError("first attempt fails")
        return "ok"


async def dead_letter(url: str, r: redis.Redis, jobs: dict[str, Any]) -> None:
    """Send ``jobs`` (key -> payload) and run PolishWorker until the stream is idle."""
    with sw.Producer.from_url(url) as producer:
        for key, payload in jobs.items():
            producer.send(STREAM, payload, key=key)
    await run_until_idle(PolishWorker.from_url(url), r, timeout=60)


# ---- 1. dlq list at 80 columns --------------------------------------------------------


def stacked(output: str) -> dict[str, dict[str, str]]:
    """The blocks of `dlq list`'s narrow layout: dead-letter id -> field -> value (a
    wrapped value's lines joined with a space)."""
    blocks: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    field = ""
    for line in output.splitlines()[1:]:
        if not line.strip():
            continue
        if not line.startswith(" "):
            current = blocks.setdefault(line.strip(), {})
        elif line.startswith("  ") and line[2] != " ":
            field, _, value = line[2:].partition("  ")
            current[field.strip()] = value.strip()
        else:
            current[field.strip()] += " " + line.strip()
    return blocks


async def test_dlq_list_is_readable_at_80_columns(redis_url: str, r: redis.Redis) -> None:
    """At 80 columns (COLUMNS=80, so rich's console is 80 wide; a pipe is the same)
    `dlq list` shows every dead letter whole: its id, key, reason, error, attempts, time
    and source id, in lines of at most 80 columns, nothing ellipsised."""
    await dead_letter(redis_url, r, {LONG_KEY: {"dead": LONG_REASON},
                                     "k-2": {"raise": LONG_ERROR}})
    dead = {eid.decode(): f for eid, f in r.xrange(DEAD)}
    assert len(dead) == 2
    in_process = cli("dlq", "list", STREAM, "--url", redis_url, columns=80)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    piped = subprocess.run([sys.executable, "-m", "streamwork", "dlq", "list", STREAM,
                            "--url", redis_url], env=env, capture_output=True, text=True,
                           timeout=60, check=False)
    for code, out in ((in_process.exit_code, in_process.output), (piped.returncode,
                                                                  piped.stdout)):
        assert code == 0, out
        assert "…" not in out, out
        assert max(len(line) for line in out.splitlines()) <= 80, out
        blocks = stacked(out)
        assert set(blocks) == set(dead), out
        for eid, fields in dead.items():
            shown = blocks[eid]
            assert shown["group"] == GROUP
            assert shown["reason"] == fields[b"reason"].decode()
            assert shown["attempts"] == fields[b"attempts"].decode()
            assert shown["source id"] == fields[b"src_id"].decode()
            assert len(shown["died"]) == len("2024-01-01 00:00:00")
        by_key = {b["key"]: b for b in blocks.values()}
        assert by_key[LONG_KEY]["reason"] == f"dead_letter: {LONG_REASON}"
        assert by_key[LONG_KEY]["error"] == f"DeadLetter: {LONG_REASON}"
        assert by_key["k-2"]["error"] == f"ValueError: {LONG_ERROR}"
        assert by_key["k-2"]["reason"] == "max_deliveries"
    # a wide console still gets the table
    wide = cli("dlq", "list", STREAM, "--url", redis_url, columns=250)
    assert "┃ id" in wide.output and LONG_KEY in wide.output


# ---- 2. tracebacks cut at line boundaries ---------------------------------------------


async def test_job_and_job_failed_cut_the_traceback_at_line_boundaries(
        redis_url: str, r: redis.Redis) -> None:
    """A dead job whose traceback is too long for its record: `streamwork job` and
    JobFailed show the error, then whole lines of the traceback's end (the last one the
    error), say that lines were cut, and leave no backtick or parenthesis open."""
    await dead_letter(redis_url, r, {"deep": {"raise": "card declined"}})
    [(_, fields)] = r.xrange(DEAD)
    traceback_lines = fields[b"detail"].decode().splitlines()
    out = cli("job", STREAM, "deep", "--url", redis_url)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("error:"))
    shown = [lines[start].split("error: ", 1)[1]]
    shown += [line[17:] for line in lines[start + 1:] if line.startswith(" " * 17)]
    assert shown[0] == "ValueError: card declined"
    assert shown[-1] == "ValueError: card declined", out.output
    assert any("cut" in line for line in shown), out.output
    kept = [line for line in shown[1:] if "cut" not in line]
    assert kept and all(line in traceback_lines for line in kept), (kept, traceback_lines)

    with sw.Producer.from_url(redis_url) as producer, pytest.raises(sw.JobFailed) as failed:
        producer.result(STREAM, "deep", timeout=30)
    message = str(failed.value)
    assert message.count("`") % 2 == 0, message
    assert message.count("(") == message.count(")"), message
    assert "cut" in message
    assert message.splitlines()[-1].strip() == "ValueError: card declined", message
    status_lines = failed.value.status.error.splitlines()
    assert all(line in traceback_lines or "cut" in line or line == shown[0]
               for line in status_lines), status_lines


# ---- 3. dlq list --json, lossless -----------------------------------------------------


def from_json(value: Any) -> Any:
    """Undo `dlq list --json`'s markers."""
    if isinstance(value, list):
        return [from_json(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and "base64" in value:
            return base64.b64decode(value["base64"])
        if len(value) == 1 and "float" in value:
            return float(value["float"])
        if len(value) == 1 and "map" in value:
            return {from_json(k): from_json(v) for k, v in value["map"]}
        return {k: from_json(v) for k, v in value.items()}
    return value


def field_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else base64.b64decode(value["base64"])


async def test_dlq_list_json_keeps_the_original_bytes(redis_url: str,
                                                      r: redis.Redis) -> None:
    """`dlq list --json` gives every original field back byte for byte (text when UTF-8,
    else {"base64": ...}) and the decoded payload exactly (bytes, non-str map keys and
    marker-like maps included); `dlq list --help` documents that shape."""
    payload = {"dead": "bad payload", "raw": b"\xff\x00\x80bytes", "text": "héllo",
               "ints": {1: "one", 2: b"\x02"}, "looks": {"base64": "not a marker"},
               "nested": [b"\xfe", {"map": 1}]}
    r.xadd(STREAM, {"d": b"\xff\xfe not messagepack", "extra": b"\x80\x81\xc3("})
    await dead_letter(redis_url, r, {"bin": payload})
    raw = {eid.decode(): f for eid, f in r.xrange(DEAD)}
    out = cli("dlq", "list", STREAM, "--json", "--url", redis_url)
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    assert len(rows) == 2
    for row in rows:
        fields = raw[row["id"]]
        original = {k[2:]: v for k, v in fields.items() if k.startswith(b"f.")}
        assert {k.encode(): field_bytes(v) for k, v in row["original"].items()} == original
    by_key = {row["key"]: row for row in rows}
    assert from_json(by_key["bin"]["payload"]) == payload
    broken = by_key[None]
    assert broken["payload"] is None
    assert broken["original"]["extra"] == {"base64": base64.b64encode(b"\x80\x81\xc3(").decode()}
    assert broken["original"]["d"] == {
        "base64": base64.b64encode(b"\xff\xfe not messagepack").decode()}
    body = decode_body(field_bytes(by_key["bin"]["original"]["d"]))
    assert body.payload == payload
    help_text = cli("dlq", "list", "--help").output
    assert '{"base64": "..."}' in help_text and '"original"' in help_text
    assert '"payload"' in help_text


# ---- 4. top into a pipe ---------------------------------------------------------------


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default (see the test below)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_top_prints_plain_frames_into_a_pipe(make_server: Any) -> None:
    """`streamwork top` whose stdout is a pipe prints a plain frame every --interval (so
    `top | tee` and logging work) until SIGINT, then exits 0; `--once` prints one. On a
    server of its own (the session's shared one carries what earlier tests left running)."""
    redis_url = make_server().url
    r = redis.Redis.from_url(redis_url)
    r.xadd(STREAM, {"d": b"x"})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    lines: list[str] = []
    # A shell starts a background job with SIGINT ignored and the child inherits that (a
    # `.ci/run &` did): give `top` the default disposition a terminal's Ctrl-C meets.
    with subprocess.Popen([sys.executable, "-m", "streamwork", "top", "--interval", "0.2",
                           "--url", redis_url], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=env, text=True,
                          preexec_fn=_default_sigint) as proc:

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            wait_for(lambda: sum("streamwork top" in line for line in lines) >= 3, 60,
                     message="three frames of `top` in the pipe while it runs")
            assert proc.poll() is None, "top must keep running"
            assert not any("\x1b[" in line for line in lines), "plain text, no terminal codes"
            assert any(line.startswith("│ polish") for line in lines), lines
        finally:
            os.kill(proc.pid, signal.SIGINT)
            try:
                code = proc.wait(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                reader.join(timeout=10)
    assert code == 0, lines

    once = cli("top", STREAM, "--once", "--interval", "0.1", "--url", redis_url)
    r.close()
    assert once.exit_code == 0, once.output
    assert once.output.count("streamwork top") == 1


# ---- 5. send to a partitioned stream --------------------------------------------------


def test_send_detects_partitions_and_takes_an_order_key(redis_url: str,
                                                        r: redis.Redis) -> None:
    """`streamwork send` to a stream recorded as split into 4 partitions sends to the
    partition its key (or --order-key) picks, says which on stderr; --partitions that
    contradicts the record is refused; --partitions on a new stream records it."""
    names = partition_names(STREAM, 4)
    with sw.Producer.from_url(redis_url, partitions=4) as producer:
        producer.send(STREAM, {"i": 0}, key="first")
    res = CliRunner().invoke(main, ["send", STREAM, '{"i": 1}', "--key", "k-1",
                                    "--url", redis_url])
    assert res.exit_code == 0, res.output
    target = names[partition_of("k-1", 4)]
    [entry_id] = [eid for eid, f in r.xrange(target) if decode_body(f[BODY_FIELD]).key == "k-1"]
    assert res.stdout.strip() == entry_id.decode()
    assert f"partition {partition_of('k-1', 4)} of 4 ({target})" in res.stderr
    assert not r.exists(STREAM), "nothing goes to the unsplit stream name"

    order = next(f"cust-{i}" for i in range(100)
                 if partition_of(f"cust-{i}", 4) != partition_of("k-2", 4))
    res = CliRunner().invoke(main, ["send", STREAM, '{"i": 2}', "--key", "k-2",
                                    "--order-key", order, "--url", redis_url])
    assert res.exit_code == 0, res.output
    sent = {body.key: body for body in (decode_body(f[BODY_FIELD]) for _, f in
                                        r.xrange(names[partition_of(order, 4)]))}
    assert sent["k-2"].options["order_key"] == order

    wrong = CliRunner().invoke(main, ["send", STREAM, "{}", "--partitions", "2",
                                      "--url", redis_url])
    assert wrong.exit_code == 1, wrong.output
    assert "4" in wrong.output and "Traceback" not in wrong.output

    fresh = CliRunner().invoke(main, ["send", "fresh", "{}", "--key", "a", "--partitions", "3",
                                      "--url", redis_url])
    assert fresh.exit_code == 0, fresh.output
    assert r.get(StreamKeys.for_stream("fresh").partitions) == b"3"
    assert r.xlen(partition_names("fresh", 3)[partition_of("a", 3)]) == 1


# ---- 6, 7, 8. help, defaults and the `none` forms -------------------------------------


def test_run_help_shows_every_worker_options_default() -> None:
    """`run --help` shows each worker option's default (from WorkerOptions), though the
    option's own default stays None (not given: the worker class's attribute)."""
    res = CliRunner().invoke(main, ["run", "--help"], terminal_width=250)
    assert res.exit_code == 0, res.output
    help_text = " ".join(res.output.split())
    for flag, shown in (("--timeout", "300"), ("--retention", "86400"),
                        ("--concurrency", "16"), ("--heartbeat / --no-heartbeat", "heartbeat"),
                        ("--ordered / --no-ordered", "no-ordered"), ("--catch-up", "last"),
                        ("--reclaim-interval", "none"), ("--max-deliveries", "5"),
                        ("--only-partition", "all")):
        assert f"[default: {shown}]" in help_text.split(flag, 1)[1].split(" --", 1)[0], flag
    run_command = main.commands["run"]
    ctx = click.Context(run_command)
    params = {p.name: p for p in run_command.params}
    for name in WorkerConfig.option_names():
        if name in ("stream", "group"):  # each worker sets its own; no default to show
            continue
        record = params[name].get_help_record(ctx)
        assert record is not None and "[default: " in record[1], name


def _harness() -> click.Command | None:
    try:
        from benchmarks.cli import bench_command
    except ImportError:
        return None
    command: click.Command = bench_command
    return command


def test_every_option_of_every_command_has_help() -> None:
    """Walk the whole command tree (the bench harness's own options too): every option
    has a non-empty description in --help."""
    missing: list[str] = []

    def walk(command: click.Command, path: str) -> None:
        ctx = click.Context(command, info_name=path)
        for param in command.get_params(ctx):
            if isinstance(param, click.Option) and not param.hidden and not (
                    param.help or "").strip():
                missing.append(f"{path} {param.opts[0]}")
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}")

    walk(main, "streamwork")
    harness = _harness()
    if harness is not None:
        walk(harness, "streamwork bench")
    assert not missing, f"options without help: {missing}"


@pytest.mark.parametrize(("option", "means"), [
    ("--retention", "keep all"), ("--timeout", "no limit"),
    ("--reclaim-interval", "min(visibility_timeout/2, 5)")])
def test_a_bad_none_option_names_the_accepted_forms(option: str, means: str) -> None:
    """`--retention forever` fails naming both accepted forms: a number of seconds, or
    'none' (and what none means for that option)."""
    res = CliRunner().invoke(main, ["run", "tests.workers.ledger:LedgerWorker", option, "forever",
                                    "--url", "redis://127.0.0.1:1/0"], terminal_width=250)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "'forever'" in text and "a number of seconds" in text, text
    assert f"or 'none' ({means})" in text, text
    assert "not a valid float" not in text


# ---- 9. the worker's stop line --------------------------------------------------------


async def test_stop_line_counts_each_outcome(redis_url: str, r: redis.Redis,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """The "worker stopped" line reports acked, retried, dead_lettered, deduplicated and
    cancelled separately, and how many deliveries were left pending (not one sum)."""
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(STREAM, {}, key="ok-1")
        producer.send(STREAM, {}, key="ok-2")
        producer.send(STREAM, {"fail_once": True}, key="flaky")
        producer.send(STREAM, {"dead": "no"}, key="doomed")
        producer.send(STREAM, {}, key="ok-1")  # a duplicate of a key the group runs
    caplog.set_level(logging.INFO, logger=WORKER_LOGGER)
    await run_until_idle(PolishWorker.from_url(redis_url), r, timeout=60)
    wait_for(lambda: any(rec.getMessage() == "worker stopped" for rec in caplog.records), 30,
             message="the worker's stop line")
    [stop] = [rec for rec in caplog.records if rec.getMessage() == "worker stopped"]
    fields = stop.sw  # type: ignore[attr-defined]
    assert {k: fields[k] for k in ("acked", "retried", "dead_lettered", "deduplicated",
                                   "cancelled", "left_pending")} == {
        "acked": 3, "retried": 1, "dead_lettered": 1, "deduplicated": 1, "cancelled": 0,
        "left_pending": 0}, fields
    assert "count" not in fields and "outcome" not in fields
    line = TextFormatter().format(stop)
    assert ("acked=3 retried=1 dead_lettered=1 deduplicated=1 cancelled=0 left_pending=0"
            in line), line
