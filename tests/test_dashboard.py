"""`streamwork dashboard` in a real browser (playwright driving Debian's chromium) against a
real Redis: the figures match `inspect --json`, a job lookup, a replay by click that then
runs, XSS payloads shown as text, and actions refused without CSRF token or login token.

``STREAMWORK_DASHBOARD_SCREENSHOT=docs/dashboard.png pytest tests/test_dashboard.py -k docs``
remakes the README's screenshot from a livelier scene (skipped otherwise).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("uvicorn", reason="the dashboard extra is not installed")
pytest.importorskip("jinja2", reason="the dashboard extra is not installed")

import httpx
import uvicorn
from click.testing import CliRunner

import streamwork as sw
from streamwork._cli.main import main
from streamwork._dashboard.app import DashboardSettings, create_app
from streamwork._wire.keys import StreamKeys
from streamwork.testing import free_port, run_until_idle, wait_for
from tests.conftest import ROOT
from tests.workers.ledger import ClientWorker

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
XSS = "<script>alert(1)</script>"
TOKEN = "test-token-0123456789abcdef"
STREAM = "orders"
GROUP = "billing"
SHOT_ENV = "STREAMWORK_DASHBOARD_SCREENSHOT"


class BillingWorker(ClientWorker):
    """Bills an order; a payload marked ``poison`` dead-letters (reason naming its note)
    until its key is in the ``healed`` set."""

    stream = STREAM
    group = GROUP
    max_deliveries = 1
    read_block = 0.1
    drain_timeout = 10.0

    def handle(self, msg: sw.Message) -> Any:
        p = msg.payload
        if p.get("poison") and not self.client().sismember("healed", msg.key or ""):
            raise sw.DeadLetter(f"cannot bill {p['note']}")
        return {"billed": p["amount"]}


def drain(url: str, r: redis.Redis) -> None:
    """Run a BillingWorker until its group is idle, on a thread of its own (the browser's
    sync API keeps an event loop on this one)."""
    failed: list[BaseException] = []

    def go() -> None:
        try:
            asyncio.run(run_until_idle(BillingWorker.from_url(url), r, timeout=30))
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=go, name="billing-worker")
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the worker did not stop"
    assert not failed, failed


def seed(url: str, r: redis.Redis, *, backlog: bool = True) -> None:
    """orders: 4 billed, 2 dead letters (one with the XSS payload and key, one "big");
    with ``backlog``, 5 more never read (lag) and 2 read but never acked (pending);
    events: 9 jobs over 3 partitions, nothing reads them."""
    with sw.Producer.from_url(url) as p:
        p.send_many(STREAM, [{"amount": i} for i in range(4)],
                    keys=[f"order-{i}" for i in range(4)])
        p.send(STREAM, {"poison": True, "note": XSS, "amount": 0}, key=XSS)
        p.send(STREAM, {"poison": True, "note": "x" * 5000, "amount": 42}, key="big")
    drain(url, r)
    if backlog:
        with sw.Producer.from_url(url) as p:
            p.send_many(STREAM, [{"amount": i} for i in range(4, 11)],
                        keys=[f"order-{i}" for i in range(4, 11)])
        r.xreadgroup(GROUP, "stuck-consumer", {STREAM: ">"}, count=2)
    with sw.Producer.from_url(url, partitions=3) as p:
        p.send_many("events", [{"i": i} for i in range(9)], keys=[f"e{i}" for i in range(9)])


def inspect_json(url: str, *stream: str) -> Any:
    result = CliRunner().invoke(main, ["inspect", *stream, "--json", "--url", url])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def dead_count(r: redis.Redis) -> int:
    return int(r.xlen(StreamKeys.for_stream(STREAM).dead))


# ---------------------------------------------------------------- fixtures


def _has_playwright() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module", name="browser")
def _browser() -> Iterator[Any]:
    """One headless chromium for the module (Debian's: no browser download). Missing
    playwright or chromium: skipped locally, a failure on CI (CI=true)."""
    missing = ("playwright is not installed (pip install -e '.[dev]')" if not _has_playwright()
               else f"{CHROMIUM} is missing (apt-get install chromium)"
               if not Path(CHROMIUM).exists() else None)
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"the dashboard's browser test cannot run on CI: {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(name="page")
def _page(browser: Any) -> Iterator[Any]:
    """A page in a fresh browser context (no cookies)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(10_000)
    yield page
    context.close()


@pytest.fixture(name="dialogs")
def _dialogs(page: Any) -> list[str]:
    """Messages of every dialog (alert, confirm, ...) the page opens; each is dismissed."""
    seen: list[str] = []

    def on_dialog(dialog: Any) -> None:
        seen.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    return seen


@pytest.fixture(name="dashboard")
def _dashboard() -> Iterator[Callable[..., str]]:
    """Factory: ``dashboard(redis_url, token=None, host="127.0.0.1")`` serves the app with
    uvicorn on a thread, on a free port; returns its base URL. Stopped afterwards."""
    running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(url: str, token: str | None = None, host: str = "127.0.0.1",
              sample_interval_s: float = 0.2, window_s: float = 60) -> str:
        settings = DashboardSettings(url, token, refresh_s=0,
                                     sample_interval_s=sample_interval_s, window_s=window_s)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(settings), host=host, port=port,
                                               log_level="warning", ws="none", lifespan="on"))
        thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
        thread.start()
        running.append((server, thread))
        wait_for(lambda: server.started or not thread.is_alive(), timeout=15,
                 message="the dashboard to start")
        assert server.started, "the dashboard did not start"
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(15)


# ---------------------------------------------------------------- tests


def test_page_shows_the_figures_of_inspect_json(redis_url: str, r: redis.Redis, page: Any,
                                                dashboard: Callable[..., str],
                                                tmp_path: Path) -> None:
    """Every stream's length, delayed and dead, and every group's consumers, lag, pending
    and retries on the page are those of `streamwork inspect --json` (a partitioned
    stream's: those of `inspect events --json`, its partitions summed up)."""
    from playwright.sync_api import expect

    base = dashboard(redis_url)
    seed(redis_url, r)
    plain = {s["stream"]: s for s in inspect_json(redis_url)}
    docs = {STREAM: plain[STREAM], "events": inspect_json(redis_url, "events")}
    assert docs["events"]["length"] == 9 and len(docs["events"]["partitions"]) == 3
    orders = docs[STREAM]["groups"][0]
    assert (orders["lag"], orders["pending"], docs[STREAM]["dead"]) == (5, 2, 2)

    page.goto(base + "/")
    shown = page.locator("section.stream").evaluate_all(
        "els => els.map(e => e.dataset.stream)")
    assert shown == ["events", STREAM]  # the partitions are shown as their stream
    for name, doc in docs.items():
        section = page.locator(f'section.stream[data-stream="{name}"]')
        for metric in ("length", "dead", "delayed_due", "delayed_total"):
            expect(section.locator(f'[data-metric="{metric}"]')).to_have_text(
                f"{doc[metric]:,}")
        assert section.locator("tr[data-group]").count() == len(doc["groups"])
        for g in doc["groups"]:
            row = section.locator(f'tr[data-group="{g["name"]}"]')
            for metric in ("consumers", "lag", "pending", "retries_waiting"):
                expect(row.locator(f'[data-metric="{metric}"]')).to_have_text(
                    f"{g[metric]:,}")
    assert page.locator("#overview svg.spark").count() == 2
    # wait for a few rate samples (every 0.2 s) so the screenshot's sparklines have a line
    wait_for(lambda: _reload_until_lines(page), timeout=15, message="sparkline points")
    page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000


def _reload_until_lines(page: Any) -> bool:
    page.reload()
    return bool(page.locator("#overview svg.spark polyline").count() >= 2)


def test_job_lookup_shows_state_and_result(redis_url: str, r: redis.Redis, page: Any,
                                           dashboard: Callable[..., str]) -> None:
    """The lookup form finds a done job (its result) and a dead one (its reason), by key."""
    from playwright.sync_api import expect

    base = dashboard(redis_url)
    seed(redis_url, r, backlog=False)
    page.goto(base + "/")
    page.select_option('select[name="job_stream"]', STREAM)
    page.fill('input[name="job_key"]', "order-2")
    page.click('#job button[type="submit"]')
    row = page.locator(f'#job-result tr[data-group="{GROUP}"]')
    expect(row.locator('[data-metric="state"]')).to_have_text("done")
    expect(row.locator('[data-metric="result"]')).to_have_text("{'billed': 2}")

    page.fill('input[name="job_key"]', "big")
    page.click('#job button[type="submit"]')
    expect(row.locator('[data-metric="state"]')).to_have_text("dead")
    expect(row).to_contain_text("cannot bill xxx")

    page.fill('input[name="job_key"]', "no-such-job")
    page.click('#job button[type="submit"]')
    expect(row.locator('[data-metric="state"]')).to_have_text("unknown")


class Halfway(sw.StreamWorker):
    """Reports half way (``msg.progress``), then holds the job until ``release`` is set."""

    stream = "exports"
    group = "exporter"
    read_block = 0.05
    visibility_timeout = 1.5

    release = threading.Event()

    async def handle(self, msg: sw.Message) -> None:
        msg.progress(0.5, note="100 of 200 rows")
        await asyncio.to_thread(self.release.wait, 30)


def test_job_lookup_shows_a_running_jobs_progress(redis_url: str, page: Any,
                                                  dashboard: Callable[..., str]) -> None:
    """A running job's last ``msg.progress`` shows in the lookup (bar, percent and note)."""
    from playwright.sync_api import expect

    worker = Halfway.from_url(redis_url)
    thread = threading.Thread(target=lambda: asyncio.run(worker.serve()))
    thread.start()
    try:
        with sw.Producer.from_url(redis_url) as p:
            p.send("exports", {}, key="export-1")
            wait_for(lambda: p.status("exports", "export-1", group="exporter").progress,
                     timeout=30, message="the progress reached Redis")
        base = dashboard(redis_url)
        page.goto(base + "/")
        page.select_option('select[name="job_stream"]', "exports")
        page.fill('input[name="job_key"]', "export-1")
        page.click('#job button[type="submit"]')
        row = page.locator('#job-result tr[data-group="exporter"]')
        expect(row.locator('[data-metric="state"]')).to_have_text("running")
        expect(row.locator('[data-metric="progress"]')).to_contain_text("50%")
        expect(row.locator('[data-metric="progress"]')).to_contain_text("100 of 200 rows")
        assert row.locator('[data-metric="progress"] progress').get_attribute("value") == "0.5"
    finally:
        Halfway.release.set()
        worker.stop()
        thread.join(30)


def test_job_lookup_shows_a_join(redis_url: str, page: Any,
                                 dashboard: Callable[..., str]) -> None:
    """Looking up a join's callback key shows the join: state and counts."""
    from playwright.sync_api import expect

    with sw.Producer.from_url(redis_url) as p:
        p.send_join([sw.Job("resize", {"n": n}) for n in range(3)],
                    then=sw.Job("albums", {}), key="album-1")
        p.send("albums", {}, key="other")  # a group on the callback stream to look in
    redis.Redis.from_url(redis_url).xgroup_create("albums", "builder", id="0")
    base = dashboard(redis_url)
    page.goto(base + "/")
    page.select_option('select[name="job_stream"]', "albums")
    page.fill('input[name="job_key"]', "album-1")
    page.click('#job button[type="submit"]')
    expect(page.locator('#job-join [data-metric="join-state"]')).to_have_text("open")
    expect(page.locator("#job-join")).to_contain_text("3 children, 0 done, 0 failed, 3 pending")


def test_replay_by_click_runs_the_job(redis_url: str, r: redis.Redis, page: Any,
                                      dashboard: Callable[..., str]) -> None:
    """Clicking a dead letter's replay button hands it back to its group: a worker then
    runs it to done and the dead-letter count drops."""
    from playwright.sync_api import expect

    base = dashboard(redis_url)
    seed(redis_url, r, backlog=False)
    assert dead_count(r) == 2
    r.sadd("healed", "big")  # the bug that killed it is fixed
    page.goto(base + "/")
    row = page.locator("table.dead tr[data-dead-id]").filter(
        has=page.locator('td[data-field="key"]', has_text="big"))
    expect(row).to_have_count(1)
    row.locator('button[value="replay"]').click()
    expect(page.locator("#flash")).to_have_text(f"{STREAM}: replayed 1 dead letter.")
    assert dead_count(r) == 1

    drain(redis_url, r)
    with sw.Producer.from_url(redis_url) as p:
        status = wait_for(lambda: (st := p.status(STREAM, "big", group=GROUP)).state == "done"
                          and st, timeout=10, message="the replayed job to be done")
    assert status.result == {"billed": 42}
    page.goto(base + "/")
    expect(page.locator(f'section[data-stream="{STREAM}"] [data-metric="dead"]')).to_have_text("1")
    expect(page.locator('td[data-field="key"]', has_text="big")).to_have_count(0)


def test_xss_payload_key_and_error_render_as_text(redis_url: str, r: redis.Redis, page: Any,
                                                  dialogs: list[str],
                                                  dashboard: Callable[..., str]) -> None:
    """A payload, key and error text holding <script>alert(1)</script> show as that text:
    no script runs (no dialog), the page's only script is its own; the payload preview is
    capped."""
    from playwright.sync_api import expect

    base = dashboard(redis_url)
    seed(redis_url, r, backlog=False)
    page.goto(base + "/")
    row = page.locator("table.dead tr[data-dead-id]").filter(
        has=page.locator('td[data-field="key"]', has_text=XSS))
    expect(row.locator('td[data-field="key"]')).to_have_text(XSS)
    expect(row.locator('[data-field="payload"]')).to_contain_text(f"'note': '{XSS}'")
    expect(row.locator('td[data-field="reason"]')).to_contain_text(f"cannot bill {XSS}")
    expect(row.locator('td[data-field="key"]')).to_be_visible()
    big = page.locator("table.dead tr[data-dead-id]").filter(
        has=page.locator('td[data-field="key"]', has_text="big"))
    preview = big.locator('[data-field="payload"]').inner_text()
    assert len(preview) <= 2048 and preview.endswith("…")

    page.select_option('select[name="job_stream"]', STREAM)
    page.fill('input[name="job_key"]', XSS)
    page.click('#job button[type="submit"]')
    expect(page.locator("#job-result h3")).to_contain_text(XSS)
    assert page.locator("script").count() == 1  # the auto-refresh, with the page's nonce
    assert dialogs == []


def test_actions_refuse_get_and_missing_csrf(redis_url: str, r: redis.Redis,
                                             dashboard: Callable[..., str]) -> None:
    """On loopback without a token: replay/purge are POST only (405), need the page's CSRF
    token (403 without it, or with a forged one, or from another origin); a wrong Host is
    refused (DNS rebinding); the response headers forbid framing and outside sources."""
    base = dashboard(redis_url)
    seed(redis_url, r, backlog=False)
    with httpx.Client(base_url=base, follow_redirects=False) as http:
        page = http.get("/")
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert page.headers["x-frame-options"] == "DENY"
        csrf = _csrf_of(page.text)
        assert http.get("/dlq/purge").status_code == 405
        form = {"stream": STREAM, "confirm": "yes"}
        assert http.post("/dlq/purge", data=form).status_code == 403
        assert http.post("/dlq/purge", data={**form, "csrf": "0" * 64}).status_code == 403
        assert http.post("/dlq/purge", data={**form, "csrf": csrf},
                         headers={"Origin": "http://evil.example"}).status_code == 403
        assert dead_count(r) == 2
        assert http.get("/", headers={"Host": "evil.example:80"}).status_code == 403
        bad = http.post("/dlq/purge", data={"stream": STREAM, "csrf": csrf})
        assert bad.status_code == 400 and "tick the box" in bad.text  # purge all: confirm
        assert http.post("/dlq/replay", data={"stream": STREAM, "csrf": csrf,
                                              "id": "nope"}).status_code == 400
        done = http.post("/dlq/purge", data={**form, "csrf": csrf})
        assert done.status_code == 303 and "done=purged&n=2" in done.headers["location"]
    assert dead_count(r) == 0


def test_pause_and_resume_buttons_need_the_csrf_token(redis_url: str, r: redis.Redis,
                                                      dashboard: Callable[..., str]) -> None:
    """A group's pause and resume are POST actions guarded as replay and purge are (405 on
    GET, 403 without the page's CSRF token, with a forged one or from another origin);
    with it the group is paused (its reason kept), the page says so, and resume ends it."""
    base = dashboard(redis_url)
    seed(redis_url, r, backlog=False)
    paused_key = StreamKeys.for_stream(STREAM).group(GROUP).paused
    with httpx.Client(base_url=base, follow_redirects=False) as http, \
            sw.Producer.from_url(redis_url) as p:
        page = http.get("/")
        assert 'action="/group/pause"' in page.text and "running" in page.text
        csrf = _csrf_of(page.text)
        form = {"stream": STREAM, "group": GROUP, "reason": "refunds <b>audit</b>"}
        assert http.get("/group/pause").status_code == 405
        assert http.post("/group/pause", data=form).status_code == 403
        assert http.post("/group/pause", data={**form, "csrf": "0" * 64}).status_code == 403
        assert http.post("/group/pause", data={**form, "csrf": csrf},
                         headers={"Origin": "http://evil.example"}).status_code == 403
        assert not r.exists(paused_key)
        typo = http.post("/group/pause", data={**form, "group": "nope", "csrf": csrf})
        assert typo.status_code == 400 and "no consumer group &#39;nope&#39;" in typo.text
        done = http.post("/group/pause", data={**form, "csrf": csrf})
        assert done.status_code == 303 and "done=paused" in done.headers["location"]
        state = p.paused(STREAM, GROUP)
        assert state is not None and state.reason == "refunds <b>audit</b>"
        page = http.get(done.headers["location"])
        assert f"{STREAM}/{GROUP}: paused." in page.text
        assert "paused</span>: refunds &lt;b&gt;audit&lt;/b&gt;" in page.text
        assert 'action="/group/resume"' in page.text
        assert http.post("/group/resume", data={"stream": STREAM, "group": GROUP}
                         ).status_code == 403
        assert p.paused(STREAM, GROUP) is not None
        done = http.post("/group/resume", data={"stream": STREAM, "group": GROUP,
                                                "csrf": csrf})
        assert done.status_code == 303 and "done=resumed" in done.headers["location"]
        assert p.paused(STREAM, GROUP) is None


def test_page_says_when_redis_is_unreachable(dashboard: Callable[..., str]) -> None:
    """Redis down: the page answers 503 naming the server (password hidden) and the error,
    not a traceback."""
    port = free_port()
    base = dashboard(f"redis://:s3cret-pw@127.0.0.1:{port}/0")
    page = httpx.get(base + "/")
    assert page.status_code == 503
    assert f"cannot read Redis at redis://:***@127.0.0.1:{port}/0" in page.text
    assert "ConnectionError" in page.text and "s3cret-pw" not in page.text


def _csrf_of(html: str) -> str:
    marker = 'name="csrf" value="'
    start = html.index(marker) + len(marker)
    return html[start:html.index('"', start)]


def test_cli_refuses_a_public_bind_without_token() -> None:
    """`dashboard --host 0.0.0.0` without a token (or with a short one) exits 1, saying
    what to do, before it binds anything."""
    runner = CliRunner(env={"STREAMWORK_DASHBOARD_TOKEN": None})
    result = runner.invoke(main, ["dashboard", "--host", "0.0.0.0"])
    assert result.exit_code == 1
    assert "token is required" in result.output and "--token" in result.output
    short = runner.invoke(main, ["dashboard", "--host", "0.0.0.0", "--token", "abc"])
    assert short.exit_code == 1 and "at least 16" in short.output


@pytest.fixture(name="public_dashboard")
def _public_dashboard(redis_url: str) -> Iterator[str]:
    """`streamwork dashboard --host 0.0.0.0 --token ...` as a child process (ended by pid);
    yields the URL it is reached at over loopback."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamwork", "dashboard", "--host", "0.0.0.0", "--port",
         str(port), "--url", redis_url, "--refresh", "0"],
        cwd=ROOT, env={**os.environ, "STREAMWORK_DASHBOARD_TOKEN": TOKEN},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is not None or _answers(base), timeout=20,
                 message="the dashboard process to listen")
        assert proc.poll() is None, proc.communicate()[0].decode()
        yield base
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def _answers(base: str) -> bool:
    try:
        return httpx.get(base + "/", timeout=1).status_code == 401
    except httpx.TransportError:
        return False


def test_public_bind_needs_the_token(redis_url: str, r: redis.Redis, page: Any,
                                     dialogs: list[str], public_dashboard: str) -> None:
    """Bound to 0.0.0.0 with a token: without it every request (page or action) is refused
    (401); with it as a Bearer header an action works; in the browser, ?token= logs in
    (the address then drops the token), and a purge by click works, while the same POST
    with the login cookie but without the CSRF token is refused (403)."""
    from playwright.sync_api import expect

    base = public_dashboard
    seed(redis_url, r, backlog=False)
    with httpx.Client(base_url=base, follow_redirects=False) as http:
        assert http.get("/").status_code == 401
        assert http.get("/?token=wrong-token-0123456789").status_code == 401
        form = {"stream": STREAM, "confirm": "yes"}
        assert http.post("/dlq/purge", data=form).status_code == 401
        assert dead_count(r) == 2
        [(xss_id, _)] = [(eid, f) for eid, f in r.xrange(StreamKeys.for_stream(STREAM).dead)
                         if b"cannot bill <script>" in f[b"reason"]]
        ok = http.post("/dlq/replay", data={"stream": STREAM, "id": xss_id.decode()},
                       headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 303, ok.text
    assert dead_count(r) == 1

    page.goto(f"{base}/?token={TOKEN}")
    assert page.url == base + "/"
    expect(page.locator(f'section[data-stream="{STREAM}"] [data-metric="dead"]')).to_have_text("1")
    forged = page.request.post(base + "/dlq/purge", form={"stream": STREAM, "confirm": "yes"})
    assert forged.status == 403
    assert dead_count(r) == 1
    page.locator("table.dead tr[data-dead-id]").first.locator('button[value="purge"]').click()
    expect(page.locator("#flash")).to_have_text(f"{STREAM}: purged 1 dead letter.")
    assert dead_count(r) == 0
    assert dialogs == []


class AuditWorker(ClientWorker):
    """A second, slower group on the orders (the docs scene)."""

    stream = STREAM
    group = "audit"
    concurrency = 2
    read_block = 0.1
    drain_timeout = 5.0

    def handle(self, msg: sw.Message) -> Any:
        time.sleep(0.02)
        return None


class AnalyticsWorker(ClientWorker):
    """Reads the partitioned events stream (the docs scene)."""

    stream = "events"
    group = "analytics"
    partitions = 3
    read_block = 0.1
    drain_timeout = 5.0

    def handle(self, msg: sw.Message) -> Any:
        return None


class _Serving:
    """A worker serving on a thread of its own until ``stop()``."""

    def __init__(self, worker: sw.StreamWorker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=lambda: asyncio.run(worker.serve()), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(15)


@pytest.mark.skipif(not os.environ.get(SHOT_ENV),
                    reason=f"makes the README's screenshot: set {SHOT_ENV}=docs/dashboard.png")
def test_docs_screenshot(redis_url: str, r: redis.Redis, page: Any,
                         dashboard: Callable[..., str]) -> None:
    """Not a check: ~15 s of traffic with changing rates (two groups on orders, one of
    them stopped half way so its lag builds up, a partitioned events stream, a few dead
    letters, two deliveries left pending), then the screenshot."""
    base = dashboard(redis_url, sample_interval_s=0.5, window_s=30)
    workers = [_Serving(BillingWorker.from_url(redis_url)),
               _Serving(AuditWorker.from_url(redis_url)),
               _Serving(AnalyticsWorker.from_url(redis_url))]
    poison = [XSS, "order-77", "order-203"]
    with sw.Producer.from_url(redis_url) as p, \
            sw.Producer.from_url(redis_url, partitions=3) as events:
        started = time.monotonic()
        n = 0
        while (t := time.monotonic() - started) < 15:
            burst = int(6 + 5 * math.sin(t / 1.5))
            for _ in range(burst):
                key = f"order-{n}"
                bad = key in poison[1:] or (n == 120)
                payload = ({"poison": True, "note": XSS if n == 120 else "card declined",
                            "amount": n} if bad else {"amount": n})
                p.send(STREAM, payload, key=XSS if n == 120 else key)
                n += 1
            events.send_many("events", [{"i": n}] * (burst // 2 + 1))
            if workers[1].thread.is_alive() and t > 8:
                workers[1].stop()  # audit falls behind: its lag grows from here
            time.sleep(0.1)
    workers[0].stop()
    workers[2].stop()
    r.xreadgroup("audit", "audit-7f3a", {STREAM: ">"}, count=2)  # pending, never acked
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{base}/?job_stream={STREAM}&job_key=order-42")
    page.screenshot(path=str(ROOT / os.environ[SHOT_ENV]), full_page=True)
