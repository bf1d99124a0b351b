"""The alert rules of examples/alerts: promtool accepts them, their promtool unit tests
(series that fire and series that do not fire each alert) pass, every rule carries what an
operator needs, and every metric name and grouping label they use is one a real
`streamwork run --metrics-port` worker exports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._redis.server import free_port
from streamwork.testing import wait_for
from tests.workers.alerts import GROUP, STREAM

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "examples" / "alerts"
RULES = ALERTS / "prometheus-rules.yml"
RULE_TESTS = ALERTS / "prometheus-rules.test.yml"
PROMTOOL = shutil.which("promtool")
NAME = re.compile(r"\bstreamwork_[a-z_]+")

#: skipped locally without promtool; on CI (CI=true) the test runs and fails instead
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("CI"),
    reason="promtool is not installed (Debian/Ubuntu: apt-get install prometheus); "
           "the rules are not validated")


def _rules() -> dict[str, str]:
    """Alert name -> the text of its rule (up to the next rule)."""
    parts = re.split(r"^\s*- alert: (\w+)\s*$", RULES.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _expr(rule: str) -> str:
    """The PromQL of one rule (a block scalar `expr: |` or a one-line expr), on one line."""
    lines = rule.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("expr:"):
            indent = len(line) - len(line.lstrip())
            body = [line.split("expr:", 1)[1].strip().lstrip("|>-").strip()]
            for nxt in lines[i + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt.strip())
            return " ".join(b for b in body if b)
    raise AssertionError(f"no expr in {rule!r}")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None, "promtool is missing on CI: .ci/run installs prometheus"
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=30,
                          cwd=ROOT)


@needs_promtool
def test_promtool_check_rules_accepts_the_rules() -> None:
    """`promtool check rules` finds every rule of the file and no error."""
    proc = _promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in proc.stdout, proc.stdout


@needs_promtool
def test_promtool_unit_tests_of_the_rules_pass() -> None:
    """`promtool test rules` runs the series of prometheus-rules.test.yml through the rules:
    each alert fires where expected (labels and rendered annotations) and nowhere else."""
    proc = _promtool("test", "rules", str(RULE_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_every_alert_is_unit_tested_firing_and_silent() -> None:
    """Each alert of the rules has a promtool case where it fires and one where it must not."""
    fires: set[str] = set()
    silent: set[str] = set()
    alert = ""
    for line in RULE_TESTS.read_text().splitlines():
        if m := re.match(r"\s*alertname: (\w+)", line):
            alert = m.group(1)
        elif re.match(r"\s*exp_alerts: \[\]", line):
            silent.add(alert)
        elif re.match(r"\s*exp_alerts:\s*$", line):
            fires.add(alert)
    rules = set(_rules())
    assert rules - fires == set(), "alerts never seen firing"
    assert rules - silent == set(), "alerts never checked silent"


def test_every_rule_has_for_severity_and_a_runbook() -> None:
    """Each rule waits (`for:`), has a severity label, a summary and a description that
    names the streamwork command to run."""
    for name, rule in _rules().items():
        assert re.search(r"^\s+for: \d+[smh]\s*$", rule, re.M), name
        assert re.search(r"^\s+severity: (warning|critical)\s*$", rule, re.M), name
        assert re.search(r"^\s+summary: ", rule, re.M), name
        description = rule.split("description:", 1)[1]
        assert re.search(r"`streamwork (inspect|dlq|top|job|run)\b", description), name


def _scrape(port: int) -> dict[str, set[str]]:
    """Metric name (sample names and family names) -> label names seen on it."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    seen: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("stream") not in (None, STREAM):
                continue
            labels = set(sample.labels) - {"le"}
            seen.setdefault(sample.name, set()).update(labels)
            seen.setdefault(family.name, set()).update(labels)
    return seen


def test_rule_metric_names_are_what_a_real_worker_exports(
    redis_url: str, r: redis.Redis, spawn_worker: Any
) -> None:
    """A `streamwork run --metrics-port` worker, after acked, retried, dead-lettered and
    reclaimed jobs, exports every streamwork_* name the rules use (in exprs and in the
    annotations' hints), with the labels the rules group and match on."""
    pytest.importorskip("opentelemetry.exporter.prometheus")
    rules = _rules()
    exprs = {name: _expr(rule) for name, rule in rules.items()}
    in_exprs = {n for e in exprs.values() for n in NAME.findall(e)}
    code = "\n".join(ln for ln in RULES.read_text().splitlines()
                     if not ln.lstrip().startswith("#"))
    anywhere = set(NAME.findall(code))
    assert in_exprs and in_exprs <= anywhere

    # a delivery taken by a consumer that is gone: the worker reclaims it after 1 s idle
    r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    producer = sw.Producer.from_url(redis_url)
    producer.send(STREAM, {}, key="abandoned")
    assert r.xreadgroup(GROUP, "gone-consumer", {STREAM: ">"}, count=1)
    port = free_port()
    spawn_worker("tests.workers.alerts:AlertsWorker", redis_url, "--metrics-port", str(port))
    producer.send_many(STREAM, [{}, {}, {"fail_until": 2}, {"dead": True},
                                {"always_fail": True}])
    producer.close()

    def all_names() -> dict[str, set[str]] | None:
        seen = _scrape(port)
        return seen if anywhere <= set(seen) else None

    try:
        seen = wait_for(all_names, 15, interval=0.2, message="every name of the rules")
    except AssertionError:
        missing = sorted(anywhere - set(_scrape(port)))
        raise AssertionError(f"the rules use names the worker does not export: {missing}") \
            from None
    for name, expr in exprs.items():
        grouping = {lbl.strip() for clause in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr)
                    for lbl in clause.split(",") if lbl.strip()}
        matched = set(re.findall(r"(\w+)\s*=~?\s*\"", expr))
        for metric in set(NAME.findall(expr)):
            missing = (grouping | matched) - seen[metric]
            assert not missing, f"{name}: {metric} has no label {missing} ({seen[metric]})"
    assert {"stream", "group"} <= seen["streamwork_stream_lag"]
    assert "group" not in seen["streamwork_stream_dead"]  # per stream: the rule groups by stream
