"""`streamwork inspect` and `streamwork top` on a real server, through click's CliRunner."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis
from click.testing import CliRunner, Result

from streamwork._cli.inspect import FAIL_EXIT_CODE
from streamwork._cli.main import main
from streamwork._cli.ops import register
from streamwork._ops.format import fmt_age
from streamwork._ops.stats import StreamStats
from streamwork._ops.thresholds import Threshold, check_thresholds, parse_threshold
from tests.test_stats import STREAM, prepare, wait_idle

if not {"inspect", "top", "job"} <= set(main.commands):
    register(main)


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def rows(output: str) -> list[list[str]]:
    """The cells of every table body row in ``output``."""
    return [[c.strip() for c in line.strip().strip("│").split("│")]
            for line in output.splitlines() if line.startswith("│")]


def row(output: str, first_cell: str) -> list[str]:
    """The cells of the first table row whose first cell is ``first_cell``."""
    for cells in rows(output):
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n{output}")


def test_register_is_idempotent() -> None:
    """Registering again keeps the one inspect/top/job set (works before and after cli
    wiring)."""
    inspect_cmd, job_cmd = main.commands["inspect"], main.commands["job"]
    register(main)
    assert main.commands["inspect"] is inspect_cmd and "top" in main.commands
    assert main.commands["job"] is job_cmd


def test_partition_options_leave_plain_streams_alone(redis_url: str, r: redis.Redis) -> None:
    """`--partitions 1` (the default) and `--partition 0` of it read the plain stream, and
    the JSON document has no partition fields: the same as without the options."""
    prepare(redis_url, r)
    plain = cli("inspect", STREAM, "--json", "--url", redis_url)
    same = cli("inspect", STREAM, "--json", "--partitions", "1", "--partition", "0",
               "--url", redis_url)
    assert same.exit_code == 0, same.output
    one, two = json.loads(plain.stdout), json.loads(same.stdout)
    assert "partitions" not in one and one.keys() == two.keys()
    assert (one["length"], one["dead"]) == (two["length"], two["dead"])


def test_inspect_json_matches_xinfo_and_xpending(redis_url: str, r: redis.Redis) -> None:
    """`inspect orders --json` reports what XINFO/XPENDING/ZCOUNT/XLEN say."""
    prepare(redis_url, r)
    wait_idle(r, 300)
    result = cli("inspect", STREAM, "--json", "--url", redis_url)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    info = r.xinfo_stream(STREAM)
    assert doc["stream"] == STREAM
    assert doc["length"] == info["length"] == 10
    assert doc["last_id"] == info["last-generated-id"].decode()
    assert (doc["delayed_due"], doc["delayed_total"], doc["dead"]) == (
        r.zcount("{orders}:delayed", "-inf", int(time.time() * 1000)), 3, r.xlen("{orders}:dead"))
    assert doc["delayed_due"] == 2
    groups = {g["name"]: g for g in doc["groups"]}
    for g in r.xinfo_groups(STREAM):
        mine = groups[g["name"].decode()]
        assert (mine["lag"], mine["pending"], mine["entries_read"], mine["consumers"]) == (
            g["lag"], g["pending"], g["entries-read"], g["consumers"])
    billing = groups["billing"]
    summary = r.xpending(STREAM, "billing")
    assert billing["pending"] == summary["pending"] == 5
    assert billing["top_consumers"] == [
        {"name": c["name"].decode(), "pending": c["pending"]} for c in summary["consumers"]]
    assert billing["oldest_pending_age_s"] >= 0.3
    assert billing["oldest_pending_id"] == summary["min"].decode()
    consumers = {c["name"].decode(): c for c in r.xinfo_consumers(STREAM, "billing")}
    assert {c["name"]: c["pending"] for c in billing["consumer_list"]} == {
        name: c["pending"] for name, c in consumers.items()}
    assert all(c["idle_s"] >= 0.3 for c in billing["consumer_list"])


def test_inspect_all_streams_human_and_json(redis_url: str, r: redis.Redis) -> None:
    """No STREAM: every stream except dead-letter ones, as tables or a JSON list."""
    prepare(redis_url, r)
    r.xadd("emails", {"d": b"x"})
    result = cli("inspect", "--json", "--url", redis_url)
    assert result.exit_code == 0, result.output
    assert [s["stream"] for s in json.loads(result.stdout)] == ["emails", "orders"]
    human = cli("inspect", "--url", redis_url)
    assert human.exit_code == 0, human.output
    out = human.stdout
    assert "stream orders" in out and "stream emails" in out and "{orders}:dead" not in out
    assert row(out, "10")[4:] == ["2 / 3", "2"]  # orders: delayed due/all, dead
    billing = row(out, "billing")  # group, consumers, entries-read, lag, pending, oldest, top
    assert billing[1:5] == ["2", "6", "4", "5"] and billing[6] == "c-a (3)"
    assert row(out, "audit")[1:5] == ["0", "?", "10", "0"]
    consumers = [cells[:3] for cells in rows(out) if len(cells) == 4]
    assert consumers == [["billing", "c-a", "3"], ["billing", "c-b", "2"]]
    assert "no consumer groups" in out  # emails


THRESHOLDS = [
    # (expression that is crossed, expression just on the other side, FAIL line)
    ("lag>9", "lag>10", "FAIL orders/audit: lag 10 > 9"),
    ("lag>=10", "lag>=11", "FAIL orders/audit: lag 10 >= 10"),
    ("pending>4", "pending>5", "FAIL orders/billing: pending 5 > 4"),
    ("pending>=5", "pending>=6", "FAIL orders/billing: pending 5 >= 5"),
    ("dead>1", "dead>2", "FAIL orders: dead 2 > 1"),
    ("delayed>2", "delayed>3", "FAIL orders: delayed 3 > 2"),
    ("delayed-due>=2", "delayed-due>=3", "FAIL orders: delayed-due 2 >= 2"),
    ("oldest-pending>0.2", "oldest-pending>600", "FAIL orders/billing: oldest-pending "),
]


def test_fail_if_exits_2_exactly_when_a_threshold_is_crossed(redis_url: str,
                                                             r: redis.Redis) -> None:
    """Each metric on both sides of its threshold: 2 with one FAIL line, else 0 and silent."""
    prepare(redis_url, r)
    wait_idle(r, 300)
    for crossed, fine, line in THRESHOLDS:
        bad = cli("inspect", STREAM, "-q", "--fail-if", crossed, "--url", redis_url)
        assert bad.exit_code == FAIL_EXIT_CODE, (crossed, bad.output)
        assert bad.stderr.startswith(line) and len(bad.stderr.splitlines()) == 1, bad.stderr
        assert bad.stdout == ""
        good = cli("inspect", STREAM, "-q", "--fail-if", fine, "--url", redis_url)
        assert good.exit_code == 0, (fine, good.output)
        assert good.output == ""
    both = cli("inspect", "--fail-if", "dead>0", "--fail-if", "lag>100", "--fail-if",
               "pending>0", "--url", redis_url)
    assert both.exit_code == FAIL_EXIT_CODE
    assert both.stderr.splitlines() == ["FAIL orders: dead 2 > 0",
                                        "FAIL orders/billing: pending 5 > 0"]
    assert "stream orders" in both.stdout  # the tables still print without -q


def test_fail_if_warns_when_redis_cannot_tell_the_lag(redis_url: str, r: redis.Redis) -> None:
    """An XDEL after the group's position makes lag unknown: WARN line, not a FAIL."""
    ids = [r.xadd("t", {"d": b"x"}) for _ in range(5)]
    r.xgroup_create("t", "g", "0")
    r.xreadgroup("g", "c", {"t": ">"}, count=2)
    r.xdel("t", ids[3])
    result = cli("inspect", "t", "--json", "--fail-if", "lag>0", "--url", redis_url)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["groups"][0]["lag"] is None
    assert result.stderr.startswith("WARN t/g: Redis cannot tell this group's lag")


@pytest.mark.parametrize("expr", ["lag", "lag<5", "lags>1", "lag>abc", "dead=0", ""])
def test_bad_fail_if_expression_is_a_clear_usage_error(expr: str) -> None:
    """A bad expression names the accepted forms (and the shell-quoting trap)."""
    result = cli("inspect", "--fail-if", expr, "--url", "redis://127.0.0.1:1/0")
    assert result.exit_code == 2
    assert "METRIC>N or METRIC>=N" in result.output and "oldest-pending" in result.output
    assert "Traceback" not in result.output


def test_missing_stream_and_unreachable_redis_exit_1(redis_url: str) -> None:
    """A missing stream is named, with the hint to list streams; no traceback."""
    result = cli("inspect", "nope", "--url", redis_url)
    assert result.exit_code == 1
    assert "'nope' does not exist" in result.output
    assert "`streamwork inspect` with no STREAM" in result.output
    down = cli("inspect", "--url", "redis://127.0.0.1:1/0")
    assert down.exit_code == 1 and "unavailable" in down.output
    assert "Traceback" not in result.output + down.output
    assert cli("top", "nope", "--once", "--interval", "0.1", "--url", redis_url).exit_code == 1


def test_top_once_renders_one_frame_with_the_right_numbers(redis_url: str,
                                                           r: redis.Redis) -> None:
    """Quiet stream: the frame shows length, lag, pending, delayed, dead, and zero rates."""
    prepare(redis_url, r)
    result = cli("top", "--once", "--interval", "0.2", "--url", redis_url)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("streamwork top")
    assert row(out, "orders") == ["orders", "10", "0.0", "2 / 3", "2"]
    billing = row(out, "orders/billing")
    assert billing[1:3] == ["4", "5"] and billing[4:] == ["0.0", "2", "running"]
    assert row(out, "orders/audit")[1:3] == ["10", "0"]
    assert "c-a" in out and "c-b" in out  # busiest consumers


def test_top_once_shows_a_produced_rate_while_jobs_arrive(redis_url: str,
                                                          r: redis.Redis) -> None:
    """XADDs from a thread during the interval give produced/s > 0; acks give acked/s > 0."""
    prepare(redis_url, r)
    stop = threading.Event()
    client = redis.Redis.from_url(redis_url)

    def produce_and_consume() -> None:
        while not stop.is_set():
            client.xadd(STREAM, {"d": b"x"})
            got = client.xreadgroup("billing", "c-a", {STREAM: ">"}, count=1)
            client.xack(STREAM, "billing", *[i for i, _ in got[0][1]])
            time.sleep(0.005)

    thread = threading.Thread(target=produce_and_consume)
    thread.start()
    try:
        result = cli("top", STREAM, "--once", "--interval", "0.3", "--url", redis_url)
    finally:
        stop.set()
        thread.join()
        client.close()
    assert result.exit_code == 0, result.output
    produced = float(row(result.stdout, "orders")[2].replace(",", ""))
    acked = float(row(result.stdout, "orders/billing")[4].replace(",", ""))
    assert produced > 0 and acked > 0, result.stdout


def test_top_once_without_streams(redis_url: str) -> None:
    result = cli("top", "--once", "--interval", "0.1", "--url", redis_url)
    assert result.exit_code == 0 and "no streams found" in result.stdout


def test_threshold_parsing_and_age_format() -> None:
    assert parse_threshold(" oldest-pending >= 300 ") == Threshold("oldest-pending", ">=", 300.0)
    assert check_thresholds([], [parse_threshold("lag>0")]) == ([], [])
    empty = StreamStats("s", 0, None, "0-0", [], 0, 0, 0)
    assert check_thresholds([empty], [parse_threshold("lag>0"), parse_threshold("dead>=0")]) == (
        ["FAIL s: dead 0 >= 0"], [])
    assert [fmt_age(x) for x in (None, 0.42, 42, 247, 7380, 273600)] == [
        "-", "0.4s", "42s", "4m07s", "2h03m", "3d04h"]


def test_inspect_shows_an_outbox_backlog(redis_url: str, r: redis.Redis) -> None:
    """Chained jobs waiting in a stream's outbox (sent to other Cluster slots, not moved
    yet) show as an ``outbox`` column when there are any, and as ``outbox`` in the JSON
    document (0 when empty)."""
    prepare(redis_url, r)
    human = cli("inspect", STREAM, "--url", redis_url)
    assert human.exit_code == 0, human.output
    assert "outbox" not in human.stdout
    assert json.loads(cli("inspect", STREAM, "--json", "--url", redis_url).stdout)["outbox"] == 0
    for i in range(3):
        r.xadd("{orders}:outbox", {"t": b"receipts", "d": f"body-{i}".encode(), "m": b"",
                                   "z": b""})
    doc = json.loads(cli("inspect", STREAM, "--json", "--url", redis_url).stdout)
    assert doc["outbox"] == r.xlen("{orders}:outbox") == 3
    human = cli("inspect", STREAM, "--url", redis_url)
    assert "outbox" in human.stdout
    assert row(human.stdout, "10")[4:] == ["2 / 3", "2", "3"]  # delayed, dead, outbox
