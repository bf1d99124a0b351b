"""TLS for tests: a self-made certificate authority with server and client certificates
(and a second, unrelated CA to trust by mistake), made with ``cryptography`` in a
directory of the test's; redis-servers that listen only on a TLS port of 127.0.0.1
(``--port 0``), each ended by its pid like any `RedisServer`; and a Sentinel deployment
whose nodes, replication and sentinels all use TLS (`local_tls_sentinels`)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from streamwork._redis.server import RedisServer, find_server_binary, free_port
from streamwork.errors import StreamworkError
from streamwork.testing import wait_for
from tests.helpers import sentinel_util

_LIFETIME = datetime.timedelta(days=2)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@dataclass(frozen=True)
class _Authority:
    """A CA's key and certificate, which sign the others."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def make(cls, common: str) -> _Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(_name(common))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + _LIFETIME)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False),
                    critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                               critical=False)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    def issue(self, common: str, *usages: x509.ObjectIdentifier,
              ip: str | None = None) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        """A leaf key and certificate for ``usages`` (server or client authentication),
        valid for ``ip`` (and localhost) when given."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(_name(common))
                   .issuer_name(self.cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + _LIFETIME)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                       self.key.public_key()), critical=False))
        if ip is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(ip)), x509.DNSName("localhost")]),
                critical=False)
        return key, builder.sign(self.key, hashes.SHA256())


@dataclass(frozen=True)
class Pki:
    """The files of one test's certificates: ``ca`` signs ``server`` (for 127.0.0.1 and
    localhost, server and client use: Redis replicas and sentinels present it as clients
    too) and ``client``; ``other_ca`` is an unrelated CA (a wrong one to trust)."""

    directory: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path

    def server_args(self, auth_clients: str = "yes") -> list[str]:
        """redis-server's TLS arguments (``--tls-port`` aside)."""
        return ["--tls-cert-file", str(self.server_cert), "--tls-key-file",
                str(self.server_key), "--tls-ca-cert-file", str(self.ca),
                "--tls-auth-clients", auth_clients]

    def conf_lines(self, auth_clients: str = "yes") -> str:
        """The same as config file lines (a sentinel's)."""
        args = self.server_args(auth_clients)
        return "".join(f"{args[i][2:]} {args[i + 1]}\n" for i in range(0, len(args), 2))

    def query(self, *, ca: Path | None = None, client_cert: bool = True) -> str:
        """redis-py's TLS options as a URL query: trust ``ca`` (this PKI's by default),
        present the client certificate unless ``client_cert`` is False."""
        fields = {"ssl_ca_certs": str(ca or self.ca), "ssl_cert_reqs": "required"}
        if client_cert:
            fields.update(ssl_certfile=str(self.client_cert), ssl_keyfile=str(self.client_key))
        return urlencode(fields, quote_via=quote, safe="/")

    def context(self) -> ssl.SSLContext:
        """An SSL context trusting ``ca`` and presenting the client certificate."""
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def make_pki(directory: Path) -> Pki:
    """A CA, its server and client certificates, and an unrelated CA, under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = _Authority.make("streamwork test CA"), _Authority.make("some other CA")
    # the server's certificate serves as a client's too: replicas and sentinels present it
    # when they connect to other servers (tls-replication)
    server_key, server_cert = ca.issue("127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH,
                                       ExtendedKeyUsageOID.CLIENT_AUTH, ip="127.0.0.1")
    client_key, client_cert = ca.issue("streamwork test client",
                                       ExtendedKeyUsageOID.CLIENT_AUTH)
    files = Pki(directory, directory / "ca.crt", directory / "server.crt",
                directory / "server.key", directory / "client.crt", directory / "client.key",
                directory / "other-ca.crt")
    _write_cert(files.ca, ca.cert)
    _write_cert(files.other_ca, other.cert)
    _write_cert(files.server_cert, server_cert)
    _write_key(files.server_key, server_key)
    _write_cert(files.client_cert, client_cert)
    _write_key(files.client_key, client_key)
    return files


#: what a server built without TLS says when asked for a TLS port (Valkey, Redis)
NO_TLS_SUPPORT = ("Failed finding TLS support", "TLS is not supported", "not compiled")


class TlsRedisServer(RedisServer):
    """A `RedisServer` listening on a TLS port only (``port``; no plain port), with
    ``pki``'s server certificate; ``auth_clients``: ``yes`` (a client certificate signed
    by the CA is required), ``optional`` or ``no``."""

    def __init__(self, pki: Pki, *, auth_clients: str = "yes",
                 extra_args: list[str] | None = None, port: int | None = None,
                 appendfsync: str | None = None) -> None:
        super().__init__(port, extra_args=extra_args, appendfsync=appendfsync)
        self.pki = pki
        self.extra_args = ["--port", "0", "--tls-port", str(self.port),
                           *pki.server_args(auth_clients), *self.extra_args]

    @property
    def url(self) -> str:
        """The server's ``rediss://`` URL with the CA and the client certificate."""
        return f"rediss://127.0.0.1:{self.port}/0?{self.pki.query()}"

    def url_with(self, *, ca: Path | None = None, client_cert: bool = True,
                 auth: str = "") -> str:
        """``url`` trusting another ``ca``, without the client certificate, or with
        ``auth`` (``user:password@``) before the host."""
        return (f"rediss://{auth}127.0.0.1:{self.port}/0?"
                f"{self.pki.query(ca=ca, client_cert=client_cert)}")

    def _wait_ready(self, timeout: float) -> None:
        """Wait until PING over TLS (with the client certificate) is answered (PONG, or
        NOAUTH from a server with a password)."""
        deadline = time.monotonic() + timeout
        context = self.pki.context()
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as raw, \
                        context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith((b"+PONG", b"-NOAUTH")):  # it answers
                        return
            except OSError:
                pass
            time.sleep(0.02)
        log = Path(self._dir) / "server.log"
        tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
        raise StreamworkError(f"TLS redis-server on port {self.port} did not start: {tail}")


def env_without_redis_url() -> dict[str, str]:
    """This process's environment without ``$REDIS_URL`` (a CLI run must use --url)."""
    return {k: v for k, v in os.environ.items() if k != "REDIS_URL"}


# --------------------------------------------------------------------------------------------
# Sentinel over TLS
# --------------------------------------------------------------------------------------------


@dataclass
class TlsSentinel(sentinel_util.Sentinel):
    """A sentinel listening on a TLS port only."""

    pki: Pki | None = None

    def client(self) -> redis.Redis:
        assert self.pki is not None
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5,
                           password=self.password, decode_responses=True, ssl=True,
                           ssl_ca_certs=str(self.pki.ca),
                           ssl_certfile=str(self.pki.client_cert),
                           ssl_keyfile=str(self.pki.client_key))


@dataclass
class TlsSentinels(sentinel_util.LocalSentinels):
    """`sentinel_util.LocalSentinels` where every node and sentinel takes TLS only."""

    pki: Pki | None = None

    @property
    def url(self) -> str:
        """The ``rediss+sentinel://`` URL with the CA and the client certificate."""
        assert self.pki is not None
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"rediss+sentinel://{hosts}/{sentinel_util.SERVICE}?{self.pki.query()}"

    def direct(self, port: int) -> redis.Redis:
        assert self.pki is not None
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10, ssl=True,
                           ssl_ca_certs=str(self.pki.ca),
                           ssl_certfile=str(self.pki.client_cert),
                           ssl_keyfile=str(self.pki.client_key))


@contextmanager
def local_tls_sentinels(pki: Pki, timeout: float = 45.0) -> Iterator[TlsSentinels]:
    """`sentinel_util.local_sentinels` over TLS: a primary and two replicas replicating
    over TLS (``tls-replication yes``) and three sentinels that take TLS and reach the
    nodes over it, each requiring a client certificate of ``pki``'s CA. Every process is
    ended by its pid afterwards."""
    made: list[TlsRedisServer] = []
    deployment: TlsSentinels | None = None
    root = Path(tempfile.mkdtemp(prefix="streamwork-tls-sentinels-"))
    try:
        replication = ["--tls-replication", "yes"]
        primary = TlsRedisServer(pki, extra_args=replication).start()
        made.append(primary)
        for _ in range(2):
            made.append(TlsRedisServer(pki, extra_args=[
                *replication, "--replicaof", "127.0.0.1", str(primary.port)]).start())
        deployment = TlsSentinels(primary, list(made[1:]), pki=pki)
        wait_for(lambda: sentinel_util._replicas_linked(deployment), timeout, 0.05,
                 message="replicas online over TLS")
        binary = find_server_binary()
        for i in range(3):
            port = free_port()
            directory = root / f"sentinel{i}"
            directory.mkdir()
            conf = sentinel_util._sentinel_conf(port, primary.port, directory, None, None)
            assert conf.startswith(f"port {port}\n")
            conf = (f"port 0\ntls-port {port}\ntls-replication yes\n{pki.conf_lines()}"
                    + conf.removeprefix(f"port {port}\n"))
            (directory / "sentinel.conf").write_text(conf)
            node = TlsSentinel(port, directory, pki=pki)
            node.proc = subprocess.Popen([binary, str(directory / "sentinel.conf"),
                                          "--sentinel"], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deployment.sentinels.append(node)
        seen: list[str | None] = [None]

        def ready() -> bool:
            seen[0] = sentinel_util._not_ready(deployment)  # type: ignore[arg-type]
            return seen[0] is None
        try:
            wait_for(ready, timeout, 0.1, message="the TLS sentinels to see each other and "
                                                  "the replicas")
        except AssertionError as late:
            raise AssertionError(f"{late}: {seen[0]}\n{deployment.logs()}") from None
        yield deployment
    finally:
        if deployment is not None:
            for s in deployment.sentinels:
                s.end()
        for server in made:
            server.close()
