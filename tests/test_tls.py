"""TLS for real: redis-servers that take TLS only (``--port 0 --tls-port``), with a CA, server
and client certificates made for the test (tests/helpers/tls_util.py), and streamwork over
``rediss://`` everywhere a URL goes: producers, workers in-process and as ``streamwork
run``, the CLI, the dashboard, Redlock masters and ``lock_urls``, and Sentinel over TLS
(``rediss+sentinel://``: data nodes replicating over TLS, sentinels taking TLS).

A wrong CA and a missing client certificate (the server has ``tls-auth-clients yes``) fail
at once with a ConfigError saying what is wrong and what to set, from the producer, the
worker and the CLI: not retried as an outage, no ssl traceback, no password shown.

Needs a server built with TLS (Debian's redis-server is; the embedded Valkey is not: the
module is skipped there, and the Makefile's Valkey pass leaves it out).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

import streamwork as sw
from streamwork._cli.main import main
from streamwork._redis import connection, sentinel, tls_connections
from streamwork._redis.faults import Fault, classify
from streamwork._redis.server import RedisServer
from streamwork._redis.tls import TlsError
from streamwork._wire.keys import redlock_fence_key, redlock_resource
from streamwork.errors import StreamworkError
from streamwork.testing import await_for, wait_for
from tests.conftest import ROOT
from tests.helpers.serving import serving
from tests.workers.sentinel import GROUP, LEDGER, STREAM, SentinelLedger

pytest.importorskip("cryptography", reason="the tests make their certificates with it")

from tests.helpers.tls_util import (
    NO_TLS_SUPPORT,
    Pki,
    TlsRedisServer,
    env_without_redis_url,
    local_tls_sentinels,
    make_pki,
)

TARGET = "tests.workers.sentinel:SentinelLedger"
SECRET = "s3cret-pw"  #: the servers' requirepass: in every URL, never in any output
#: how long a misconfiguration may take to be reported (it is not retried as an outage:
#: measured well under a second; the rest is room for a busy machine). A worker retrying
#: it as an outage would never return; a producer would raise RedisUnavailable instead
PROMPT = 30.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _start(pki: Pki, **kwargs: object) -> TlsRedisServer:
    """A TLS server with a password, or a skip when the binary has no TLS."""
    server = TlsRedisServer(pki, extra_args=["--requirepass", SECRET], **kwargs)  # type: ignore[arg-type]
    try:
        return server.start()
    except StreamworkError as exc:
        server.close()
        if any(word in str(exc) for word in NO_TLS_SUPPORT):
            pytest.skip(f"this redis-server was built without TLS: {exc}")
        raise


@pytest.fixture(scope="module")
def server(pki: Pki) -> Iterator[TlsRedisServer]:
    """A server that requires a client certificate (tls-auth-clients yes)."""
    started = _start(pki)
    yield started
    started.close()


def _url(server: TlsRedisServer, **kwargs: object) -> str:
    return server.url_with(auth=f":{SECRET}@", **kwargs)  # type: ignore[arg-type]


@pytest.fixture(name="url")
def _clean_url(server: TlsRedisServer) -> str:
    """The server's rediss:// URL (CA, client certificate, password); emptied first."""
    url = _url(server)
    with connection.sync_client(url) as client:
        client.flushall()
    return url


@pytest.fixture(name="direct")
def _direct(url: str) -> Iterator[redis.Redis]:
    with connection.sync_client(url) as client:
        yield client


def _ledger(client: redis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(LEDGER).items()}


def _send(url: str, n: int, prefix: str = "job") -> list[str]:
    keys = [f"{prefix}-{i}" for i in range(n)]
    with sw.Producer.from_url(url) as producer:
        producer.send_many(STREAM, [{"k": k} for k in keys], keys)
    return keys


# ---- everything over rediss:// --------------------------------------------------------------


async def test_producer_and_worker_run_jobs_over_tls(url: str, direct: redis.Redis) -> None:
    """Jobs sent by a Producer and an AsyncProducer over rediss:// are each applied once by
    an in-process worker given the same URL; the server saw only TLS clients."""
    keys = _send(url, 100)
    async with sw.AsyncProducer.from_url(url) as producer:
        more = [f"async-{i}" for i in range(100)]
        await producer.send_many(STREAM, [{"k": k} for k in more], more)
    worker = SentinelLedger.from_url(url)
    async with serving(worker, ready=True):
        await await_for(lambda: len(_ledger(direct)) >= 200, timeout=60,
                        message="200 jobs applied over TLS")
    assert _ledger(direct) == dict.fromkeys(keys + more, 1)
    assert direct.config_get("port")["port"] == "0"  # no plain port: only TLS reached it


def test_streamwork_run_and_the_cli_over_tls(url: str, direct: redis.Redis,
                                             spawn_worker: Callable[..., subprocess.Popen[bytes]],
                                             tmp_path: Path) -> None:
    """`streamwork send`, `run`, `inspect`, `job`, `dlq list`, `top` and `schedules` with
    --url rediss://... (and `send` with $REDIS_URL)."""
    runner = CliRunner()
    sent = runner.invoke(main, ["send", STREAM, '{"k": "k1"}', "--key", "k1", "--url", url])
    assert sent.exit_code == 0, sent.output
    sent = CliRunner(env={"REDIS_URL": url}).invoke(main, ["send", STREAM, '{"k": "k2"}',
                                                           "--key", "k2"])
    assert sent.exit_code == 0, sent.output
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = spawn_worker(TARGET, url, stdout=out)
        wait_for(lambda: len(_ledger(direct)) >= 2 or proc.poll() is not None, 60, 0.05,
                 message="the CLI's jobs applied by `streamwork run` over TLS")
        assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
    assert _ledger(direct) == {"k1": 1, "k2": 1}
    inspected = runner.invoke(main, ["inspect", STREAM, "--json", "--url", url])
    assert inspected.exit_code == 0, inspected.output
    assert json.loads(inspected.output)["stream"] == STREAM
    for args in (["job", STREAM, "k1", "--group", GROUP], ["dlq", "list", STREAM],
                 ["top", "--once", "--interval", "0.2"], ["schedules", STREAM], ["inspect"]):
        result = runner.invoke(main, [*args, "--url", url])
        assert result.exit_code == 0, f"{args}: {result.output}"
        assert SECRET not in result.output
    job = runner.invoke(main, ["job", STREAM, "k1", "--group", GROUP, "--json", "--url", url])
    assert '"done"' in job.output, job.output


def test_dashboard_reads_over_tls(url: str, pki: Pki, server: TlsRedisServer) -> None:
    """The web page shows the streams of a server reached over rediss://; with a wrong CA
    it answers 503 saying what is wrong (no password)."""
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    pytest.importorskip("jinja2", reason="the dashboard extra is not installed")
    from starlette.testclient import TestClient

    from streamwork._dashboard.app import DashboardSettings, create_app
    with sw.Producer.from_url(url) as producer:
        producer.send("web-jobs", {"n": 1})
    web = TestClient(create_app(DashboardSettings(url, refresh_s=0)),
                     base_url="http://127.0.0.1:8321")
    page = web.get("/")
    assert page.status_code == 200 and "web-jobs" in page.text
    assert SECRET not in page.text
    wrong = TestClient(create_app(DashboardSettings(_bad_url(pki, server, "wrong-ca"),
                                                    refresh_s=0)),
                       base_url="http://127.0.0.1:8321")
    page = wrong.get("/")
    assert page.status_code == 503, page.text
    assert "does not trust" in page.text and "ssl_ca_certs" in page.text
    assert SECRET not in page.text


def test_redlock_and_lock_urls_over_tls(pki: Pki, url: str) -> None:
    """Redlock over three TLS masters (sync and asyncio), and a worker taking its job
    leases from them (lock_urls of rediss:// URLs) applies every job once."""
    masters = [_start(pki) for _ in range(3)]
    try:
        urls = [_url(m) for m in masters]
        with sw.Redlock(urls) as lock:
            held = lock.acquire("invoice-7")
            assert held.fencing_token >= 1
            for m in urls:
                with connection.sync_client(m) as c:
                    assert c.exists("redlock:{invoice-7}")
            assert held.release() is True

        async def go() -> None:
            async with sw.AsyncRedlock(urls) as alock:
                aheld = await alock.acquire("invoice-8")
                assert aheld.fencing_token >= 1
                assert await aheld.release() is True

            keys = _send(url, 50, "leased")
            worker = SentinelLedger.from_url(url, lock_urls=urls)
            with connection.sync_client(url) as direct:
                async with serving(worker, ready=True):
                    await await_for(lambda: len(_ledger(direct)) >= 50, timeout=60,
                                    message="50 jobs applied under TLS Redlock leases")
                assert _ledger(direct) == dict.fromkeys(keys, 1)
            for m in urls:  # each job's lease was taken on every TLS master
                with connection.sync_client(m) as c:
                    assert all(c.exists(redlock_fence_key(redlock_resource(STREAM, k)))
                               for k in keys)
        asyncio.run(go())
    finally:
        for m in masters:
            m.close()


def test_optional_client_certificates_need_none(pki: Pki) -> None:
    """With tls-auth-clients optional, the CA alone is enough (no client certificate)."""
    server = _start(pki, auth_clients="optional")
    try:
        url = _url(server, client_cert=False)
        assert "ssl_certfile" not in url
        with sw.Producer.from_url(url) as producer:
            producer.send("optional", {"n": 1})
        with connection.sync_client(url) as client:
            assert client.xlen("optional") == 1
    finally:
        server.close()


async def test_a_restart_over_tls_is_an_outage_not_a_config_error(pki: Pki) -> None:
    """A TLS server killed and started again under a serving worker and a producer is
    ridden out as an outage (the connections it drops are not taken for a refused
    certificate): every job sent before, during and after is applied once."""
    server = _start(pki, appendfsync="always")
    try:
        url = _url(server)
        keys = _send(url, 50, "before")
        worker = SentinelLedger.from_url(url)
        with connection.sync_client(url) as direct:
            async with serving(worker, ready=True) as task:
                await await_for(lambda: len(_ledger(direct)) >= 50, timeout=60,
                                message="the first 50 jobs applied")
                await asyncio.to_thread(server.restart, 0.5)
                keys += await asyncio.to_thread(_send, url, 50, "after")
                await await_for(lambda: len(_ledger(direct)) >= 100 or task.done(),
                                timeout=90, message="the jobs sent after the restart applied")
                assert not task.done(), "the worker stopped"
            assert _ledger(direct) == dict.fromkeys(keys, 1)
    finally:
        server.close()


# ---- misconfigurations: clear errors, at once ------------------------------------------------


#: the misconfigurations, and what the message must say
BAD = {
    "wrong-ca": ({"ca": "other"}, "presented a certificate this client does not trust",
                 "ssl_ca_certs"),
    "no-client-cert": ({"client_cert": False}, "requires a client certificate and this "
                       "client gave none", "ssl_certfile="),
}


def _bad_url(pki: Pki, server: TlsRedisServer, case: str) -> str:
    given, _, _ = BAD[case]
    kwargs: dict[str, object] = {}
    if given.get("ca") == "other":
        kwargs["ca"] = pki.other_ca
    if given.get("client_cert") is False:
        kwargs["client_cert"] = False
    return _url(server, **kwargs)


def _says(text: str, case: str) -> None:
    _, what, fix = BAD[case]
    assert what in text and fix in text, text
    assert SECRET not in text, "the password was shown"
    assert "Traceback" not in text


@pytest.mark.parametrize("case", list(BAD))
def test_producer_fails_at_once_with_a_config_error(pki: Pki, server: TlsRedisServer,
                                                    case: str) -> None:
    """A Producer's send raises ConfigError naming the fault (not RedisUnavailable after
    its retry budget), as does an AsyncProducer's and a Redlock's acquire (not "no
    quorum"); the error is fatal to a worker's loops."""
    url = _bad_url(pki, server, case)
    started = time.monotonic()
    with pytest.raises(sw.ConfigError) as raised, sw.Producer.from_url(url) as producer:
        producer.send("s", {"n": 1})
    assert time.monotonic() - started < PROMPT
    _says(str(raised.value), case)
    assert classify(raised.value) is Fault.FATAL

    async def go() -> None:
        async with sw.AsyncProducer.from_url(url) as producer:
            await producer.send("s", {"n": 1})
    with pytest.raises(sw.ConfigError) as again:
        asyncio.run(go())
    _says(str(again.value), case)
    with sw.Redlock([url]) as lock, pytest.raises(sw.ConfigError) as refused:
        lock.acquire("invoice-9")  # not "no quorum": the master's TLS is misconfigured
    _says(str(refused.value), case)


@pytest.mark.parametrize("case", list(BAD))
async def test_worker_stops_at_once_with_a_config_error(pki: Pki, server: TlsRedisServer,
                                                        case: str) -> None:
    """A worker's serve() raises the ConfigError instead of waiting out an outage."""
    worker = SentinelLedger.from_url(_bad_url(pki, server, case))
    started = time.monotonic()
    with pytest.raises(sw.ConfigError) as raised:
        await asyncio.wait_for(worker.serve(), PROMPT)
    assert time.monotonic() - started < PROMPT
    _says(str(raised.value), case)


@pytest.mark.parametrize("case", list(BAD))
def test_cli_and_streamwork_run_fail_with_one_line(pki: Pki, server: TlsRedisServer,
                                                   case: str) -> None:
    """`streamwork send`, `inspect`, `job` and `run` exit 1 with the message, no traceback,
    no password; `run` at once, not after retrying as if Redis were down."""
    url = _bad_url(pki, server, case)
    for args in (["send", "s", '{"n": 1}'], ["inspect"], ["job", "s", "k", "--group", "g"],
                 ["run", TARGET]):
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "streamwork", *args, "--url", url],
                              cwd=ROOT, env={**env_without_redis_url(), "PYTHONPATH": str(ROOT)},
                              capture_output=True, text=True, timeout=120, check=False)
        took = time.monotonic() - started
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert took < PROMPT * 2, f"{args} took {took:.1f}s"  # a Python start-up too
        _says(done.stdout + done.stderr, case)
        assert done.stderr.strip().startswith("Error:"), done.stderr


def test_rediss_to_a_plain_port_says_so(make_server: Callable[..., RedisServer],
                                        pki: Pki) -> None:
    """A rediss:// URL naming a port that takes plain connections (its handshake gets no
    answer): a ConfigError saying to use redis:// or the TLS port, from a producer, an
    asyncio client and the CLI, not an outage."""
    plain = make_server()
    url = f"rediss://:{SECRET}@127.0.0.1:{plain.port}/0?{pki.query()}"
    with pytest.raises(TlsError, match="answers without TLS") as raised, \
            sw.Producer.from_url(url) as producer:
        producer.send("s", {"n": 1})
    assert "redis://" in str(raised.value) and SECRET not in str(raised.value)

    async def go() -> None:
        client = connection.async_client(url)
        try:
            await client.ping()
        finally:
            await client.aclose()
    with pytest.raises(TlsError, match="answers without TLS"):
        asyncio.run(go())
    result = CliRunner().invoke(main, ["inspect", "--url", url])
    assert result.exit_code == 1 and "answers without TLS" in result.output, result.output


def test_an_eof_after_the_handshake_is_told_by_the_probe(pki: Pki,
                                                        server: TlsRedisServer) -> None:
    """Under TLS 1.3 a server refuses a missing client certificate after the handshake,
    and the client may see only an EOF: the probe (one more connection, listening) finds
    the server's reason; against a server that accepts the client it finds none, and the
    EOF stays an outage."""
    eof = redis.ConnectionError("Connection closed by server.")
    eof.__cause__ = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    assert classify(eof) is Fault.TRANSIENT

    def conn(client_cert: bool) -> tls_connections.SyncConnection:
        kwargs = {"ssl_certfile": str(pki.client_cert),
                  "ssl_keyfile": str(pki.client_key)} if client_cert else {}
        return tls_connections.SyncConnection(
            host="127.0.0.1", port=server.port, password=SECRET,
            ssl_ca_certs=str(pki.ca), **kwargs)
    with pytest.raises(TlsError, match="requires a client certificate"):
        conn(False)._raise_diagnosed(eof, handshaken=True)
    conn(True)._raise_diagnosed(eof, handshaken=True)  # no reason found: raises nothing

    async def go() -> None:
        def aconn(client_cert: bool) -> tls_connections.AsyncConnection:
            kwargs = {"ssl_certfile": str(pki.client_cert),
                      "ssl_keyfile": str(pki.client_key)} if client_cert else {}
            return tls_connections.AsyncConnection(
                host="127.0.0.1", port=server.port, password=SECRET,
                ssl_ca_certs=str(pki.ca), **kwargs)
        with pytest.raises(TlsError, match="requires a client certificate"):
            await aconn(False)._raise_diagnosed(eof, handshaken=True)
        await aconn(True)._raise_diagnosed(eof, handshaken=True)
    asyncio.run(go())


@pytest.mark.parametrize(("query", "says"), [
    ("ssl_ca_certs=/no/such/ca.crt", "ssl_ca_certs='/no/such/ca.crt' is not a file"),
    ("ssl_certfile=/no/such/client.crt", "ssl_certfile='/no/such/client.crt' is not a file"),
    ("ssl_cert_reqs=maybe", "ssl_cert_reqs='maybe': give one of none, optional, required"),
    ("ssl_check_hostname=perhaps", "ssl_check_hostname='perhaps': give true or false"),
])
def test_tls_options_are_checked_before_connecting(query: str, says: str) -> None:
    """A TLS option that cannot work fails when the URL is resolved (Producer, worker,
    --url), naming it; TLS options on a redis:// URL are refused too."""
    url = f"rediss://:{SECRET}@127.0.0.1:1/0?{query}"
    with pytest.raises(sw.ConfigError, match="url: ") as raised:
        sw.Producer.from_url(url)
    assert says in str(raised.value) and SECRET not in str(raised.value)
    with pytest.raises(sw.ConfigError):
        SentinelLedger.from_url(url)
    sent = CliRunner().invoke(main, ["send", "s", "1", "--url", url])
    assert sent.exit_code == 2 and says in sent.output, sent.output
    with pytest.raises(sw.ConfigError, match="TLS options, but a redis:// URL"):
        connection.resolve_url("redis://127.0.0.1:1/0?ssl_ca_certs=/etc/hostname")
    with pytest.raises(sw.ConfigError, match="lock_urls"):
        SentinelLedger.from_url("redis://127.0.0.1:1/0", lock_urls=[url])


def test_sentinel_urls_take_the_tls_options(pki: Pki) -> None:
    """rediss+sentinel:// passes the TLS options to the sentinels and the primary alike;
    on redis+sentinel:// they are refused."""
    url = f"rediss+sentinel://h1,h2:26380/svc?{pki.query()}&ssl_check_hostname=false"
    spec = sentinel.parse(connection.resolve_url(url))
    expected = {"ssl_ca_certs": str(pki.ca), "ssl_certfile": str(pki.client_cert),
                "ssl_keyfile": str(pki.client_key), "ssl_cert_reqs": "required",
                "ssl_check_hostname": False}
    assert dict(spec.tls_options) == expected
    primary = spec.primary_options()
    assert {k: primary[k] for k in expected} == expected and primary["ssl"] is True
    sentinels = spec.sentinel_options({"socket_timeout": 1.0})
    assert {k: sentinels[k] for k in expected} == expected and sentinels["ssl"] is True
    with pytest.raises(sw.ConfigError, match="TLS options, but a redis\\+sentinel:// URL"):
        connection.resolve_url(url.replace("rediss+", "redis+"))


# ---- Sentinel over TLS -----------------------------------------------------------------------


@pytest.mark.sentinel
def test_sentinel_over_tls(pki: Pki, spawn_worker: Callable[..., subprocess.Popen[bytes]],
                           tmp_path: Path) -> None:
    """A deployment that is TLS throughout (data nodes replicating over TLS, sentinels
    taking TLS and reaching the nodes over it): a producer and a `streamwork run` worker
    given the rediss+sentinel:// URL apply every job once; the CLI reads through it; a
    wrong CA or no client certificate is a ConfigError from the producer and the CLI."""
    _start(pki).close()  # skips when the server has no TLS
    with local_tls_sentinels(pki) as deployment:
        url = deployment.url
        assert url.startswith("rediss+sentinel://")
        keys = _send(url, 200, "sentinel")
        log = tmp_path / "worker.log"
        with log.open("wb") as out, deployment.direct(deployment.primary.port) as primary:
            proc = spawn_worker(TARGET, url, stdout=out)
            wait_for(lambda: primary.hlen(LEDGER) >= 200 or proc.poll() is not None, 60, 0.05,
                     message="200 jobs applied through the TLS sentinels")
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
            assert _ledger(primary) == dict.fromkeys(keys, 1)
            assert primary.config_get("tls-replication")["tls-replication"] == "yes"
        inspected = CliRunner().invoke(main, ["inspect", STREAM, "--url", url])
        assert inspected.exit_code == 0, inspected.output
        base = url.split("?", 1)[0]
        for case, query in (("wrong-ca", pki.query(ca=pki.other_ca)),
                            ("no-client-cert", pki.query(client_cert=False))):
            bad = f"{base}?{query}"
            with pytest.raises(sw.ConfigError) as raised, sw.Producer.from_url(bad) as p:
                p.send("s", {"n": 1})
            _says(str(raised.value), case)
            result = CliRunner().invoke(main, ["inspect", "--url", bad])
            assert result.exit_code == 1, result.output
            _says(result.output, case)
