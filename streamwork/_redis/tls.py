"""TLS (``rediss://``): checking a URL's TLS options before anything connects, and telling
a TLS misconfiguration from an outage.

A server certificate this client does not trust, a client certificate the server asks for
and does not get (or refuses), a ``rediss://`` URL naming a port that speaks no TLS: redis-py
reports each as a ``ConnectionError``, the same as a server that is down, and a worker
would back off and retry it forever. `diagnose` tells which it is, and the connection
classes of `streamwork._redis.tls_connections` (redis-py's, diagnosed) raise `TlsError`
instead: a `ConfigError` naming what is wrong and what to set, which `faults.classify`
takes as fatal.

Under TLS 1.3 a server that refuses the client's certificate does so after the handshake,
as the client sends its first command; the server's alert then races the connection's
reset, and the client may see only an EOF, which a server that went down looks like too.
So when a TLS connection fails right after its handshake without a clear reason, one more
connection is made to listen (sending nothing): a server that refuses the client says why
at once. A handshake that times out may be a ``rediss://`` URL naming a port without TLS:
a plain ``PING`` to it tells (`plain_answer` reads the reply).

redis-py reads the options from the URL's query (``?ssl_ca_certs=...``); `check_url` checks
the ones named in `OPTIONS` first, so a path that does not exist fails at once, naming it.
"""

from __future__ import annotations

import os
import ssl
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

import redis.exceptions

from streamwork.errors import ConfigError

#: the TLS options streamwork checks and passes on (redis-py's names; the sentinel URL's
#: parser passes these to the sentinels and the primary alike)
FILE_OPTIONS: Final = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
OPTIONS: Final = (*FILE_OPTIONS, "ssl_cert_reqs", "ssl_check_hostname", "ssl_password",
                  "ssl_ca_path")
_CERT_REQS: Final = ("none", "optional", "required")
_BOOLEANS: Final = {"true": True, "yes": True, "1": True, "false": False, "no": False,
                    "0": False}
_TLS_SCHEMES: Final = ("rediss://", "rediss+sentinel://")
PROBE_SECONDS: Final = 1.0  #: how long `_probe` listens for the server's alert


class TlsError(ConfigError, redis.exceptions.ConnectionError):
    """A TLS connection that cannot work as configured (an untrusted server certificate, a
    client certificate missing or refused, no TLS on that port): fix the URL's TLS options
    or the certificates. A `ConfigError` for streamwork (fatal, not an outage); to redis-py
    a ConnectionError like an `AuthenticationError`, so a sentinel that fails this way is
    passed over for the next one as a sentinel that does not answer is."""

    def __init__(self, message: str) -> None:
        ConfigError.__init__(self, "url", message)
        self.status_code = None  # what redis-py's RedisError sets (8.x)
        kinds = getattr(redis.exceptions, "ExceptionType", None)  # redis-py 8.x
        if kinds is not None:
            self.error_type = kinds.TLS


def _query(url: str) -> dict[str, str]:
    try:
        return dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
    except ValueError:
        return {}


def check_url(url: str) -> None:
    """Raise a ConfigError if ``url``'s TLS options cannot work: given on a URL without TLS,
    a file that is not there or cannot be read, a value redis-py does not take."""
    fields = {k: v for k, v in _query(url).items() if k in OPTIONS}
    if not fields:
        return
    if not url.startswith(_TLS_SCHEMES):
        scheme = url.partition("://")[0]
        raise ConfigError("url", f"{', '.join(sorted(fields))} are TLS options, but a "
                                 f"{scheme}:// URL connects without TLS: use rediss:// (or "
                                 "rediss+sentinel://) to connect over TLS, or drop them")
    for name in FILE_OPTIONS:
        path = fields.get(name)
        if path is not None and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            what = {"ssl_ca_certs": "the CA certificate(s) that signed the server's "
                                    "certificate",
                    "ssl_certfile": "this client's certificate",
                    "ssl_keyfile": "this client's private key"}[name]
            raise ConfigError("url", f"{name}={path!r} is not a file this process can read: "
                                     f"give the path of {what} (PEM)")
    if "ssl_keyfile" in fields and "ssl_certfile" not in fields:
        raise ConfigError("url", "ssl_keyfile is given without ssl_certfile: give the client "
                                 "certificate too (ssl_certfile=...), or drop the key")
    reqs = fields.get("ssl_cert_reqs")
    if reqs is not None and reqs not in _CERT_REQS:
        raise ConfigError("url", f"ssl_cert_reqs={reqs!r}: give one of "
                                 f"{', '.join(_CERT_REQS)} (required, the default, checks the "
                                 "server's certificate against ssl_ca_certs)")
    hostname = fields.get("ssl_check_hostname")
    if hostname is not None and hostname.lower() not in _BOOLEANS:
        raise ConfigError("url", f"ssl_check_hostname={hostname!r}: give true or false")


def connection_options(fields: dict[str, str]) -> dict[str, Any]:
    """The TLS options among a URL's query ``fields`` as redis-py's keyword arguments."""
    options: dict[str, Any] = {k: v for k, v in fields.items() if k in OPTIONS}
    if "ssl_check_hostname" in options:
        options["ssl_check_hostname"] = _BOOLEANS[options["ssl_check_hostname"].lower()]
    return options


# --------------------------------------------------------------------------------------------
# what a failed connection says
# --------------------------------------------------------------------------------------------

#: OpenSSL's reasons for a server refusing this client's certificate, or asking for one
_CERT_REQUIRED: Final = frozenset({"TLSV13_ALERT_CERTIFICATE_REQUIRED",
                                   "SSLV3_ALERT_HANDSHAKE_FAILURE",
                                   "PEER_DID_NOT_RETURN_A_CERTIFICATE"})
_CERT_REFUSED: Final = frozenset({"TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE",
                                  "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
                                  "SSLV3_ALERT_CERTIFICATE_EXPIRED",
                                  "SSLV3_ALERT_CERTIFICATE_REVOKED",
                                  "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
                                  "TLSV1_ALERT_ACCESS_DENIED", "TLSV1_ALERT_DECRYPT_ERROR"})
#: the server did not answer in TLS (a plain port)
_NOT_TLS: Final = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE",
                             "UNKNOWN_PROTOCOL", "HTTP_REQUEST", "PACKET_LENGTH_TOO_LONG"})
#: the versions or ciphers of the two sides do not meet
_NO_COMMON: Final = frozenset({"UNSUPPORTED_PROTOCOL", "TLSV1_ALERT_PROTOCOL_VERSION",
                               "NO_PROTOCOLS_AVAILABLE", "NO_SHARED_CIPHER",
                               "SSLV3_ALERT_ILLEGAL_PARAMETER"})


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes and contexts (a ConnectionError wraps the ssl error)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 10:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


class Peer:
    """What a diagnosis says about a connection: where, and which certificates it used."""

    __slots__ = ("ca", "certfile", "where")

    def __init__(self, conn: Any) -> None:
        self.where = f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"
        self.certfile: str | None = getattr(conn, "certfile", None)
        self.ca: str | None = getattr(conn, "ca_certs", None)


def diagnose(exc: BaseException, peer: Peer) -> TlsError | None:
    """The TlsError ``exc`` (a failed TLS connection) stands for, or None when it may be an
    outage like any other (a reset, a timeout, an EOF without an alert)."""
    for err in _chain(exc):
        if isinstance(err, TlsError):
            return err
        if isinstance(err, ssl.SSLCertVerificationError):
            return _untrusted(err, peer)
        if isinstance(err, ssl.SSLError) and not isinstance(
                err, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLWantReadError,
                      ssl.SSLWantWriteError, ssl.SSLSyscallError)):
            return _refused(err, peer)
    return None


def _untrusted(err: ssl.SSLCertVerificationError, peer: Peer) -> TlsError:
    why = str(err.verify_message or err.reason or err)
    if err.verify_code == 62 or "hostname" in why.lower() or "ip address mismatch" in why.lower():
        return TlsError(f"TLS: the certificate of the server at {peer.where} is not valid for "
                        f"that host ({why}). Connect by a host name or address the certificate "
                        "holds (its subject alternative names), or reissue it with that name; "
                        "ssl_check_hostname=false skips this check (the CA is still checked)")
    if "expired" in why or "not yet valid" in why:
        return TlsError(f"TLS: the certificate of the server at {peer.where} is out of date "
                        f"({why}): renew the server's certificate (tls-cert-file), and check "
                        "this machine's clock")
    trusted = (f"ssl_ca_certs={peer.ca}" if peer.ca
               else "no ssl_ca_certs: only the system's CAs")
    return TlsError(f"TLS: the server at {peer.where} presented a certificate this client does "
                    f"not trust ({why}; trusted: {trusted}). Set ssl_ca_certs in the URL to "
                    "the CA certificate that signed the server's certificate (the CA of its "
                    "tls-cert-file), e.g. rediss://host:6380/0?ssl_ca_certs=/path/ca.crt")


def _refused(err: ssl.SSLError, peer: Peer) -> TlsError | None:
    reason = str(err.reason or "")
    if reason in _CERT_REQUIRED and not peer.certfile:
        return TlsError(f"TLS: the server at {peer.where} requires a client certificate and "
                        f"this client gave none ({reason}). Add ssl_certfile=/path/client.crt"
                        "&ssl_keyfile=/path/client.key to the URL: a certificate signed by a "
                        "CA the server trusts (its tls-ca-cert-file)")
    if reason in _CERT_REQUIRED or reason in _CERT_REFUSED:
        return TlsError(f"TLS: the server at {peer.where} refused this client's certificate "
                        f"{peer.certfile or ''} ({reason}). Give one (ssl_certfile, "
                        "ssl_keyfile) signed by a CA the server trusts (its "
                        "tls-ca-cert-file), and in date")
    if reason in _NOT_TLS:
        return TlsError(f"TLS: the server at {peer.where} did not answer in TLS ({reason}): "
                        "that port takes plain connections. Use redis:// for it, or the port "
                        "the server takes TLS on (its tls-port)")
    if reason in _NO_COMMON:
        return TlsError(f"TLS: this client and the server at {peer.where} share no TLS "
                        f"version or cipher ({reason}): check the server's tls-protocols and "
                        "tls-ciphers, and ssl_min_version")
    if reason in {"KEY_VALUES_MISMATCH", "PEM_LIB", "NO_START_LINE", "BAD_DECRYPT",
                  "CA_MD_TOO_WEAK", "EE_KEY_TOO_SMALL"}:
        return TlsError(f"TLS: the certificate files given could not be used ({reason}: "
                        f"{err}). Check that ssl_certfile and ssl_keyfile are a PEM "
                        "certificate and its own private key (ssl_password if the key is "
                        "encrypted), and ssl_ca_certs a PEM CA certificate")
    return None


def after_handshake(exc: BaseException) -> bool:
    """Whether a failure right after a TLS handshake may be the server refusing the
    client's certificate, seen as an EOF or a reset instead of its alert."""
    return any(isinstance(e, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError,
                              ConnectionResetError, BrokenPipeError))
               or (isinstance(e, redis.exceptions.ConnectionError)
                   and "closed by server" in str(e))
               for e in _chain(exc))


def plain_answer(reply: bytes, peer: Peer) -> TlsError | None:
    """The TlsError for a port that answered a plain ``PING`` (PONG, or an error such as
    NOAUTH: a Redis speaking without TLS), else None."""
    if not reply.startswith((b"+", b"-")):
        return None
    return TlsError(f"TLS: the server at {peer.where} answers without TLS (a plain PING got "
                    f"{reply.split(b' ')[0].strip().decode('ascii', 'replace')!r}) and never "
                    "answered the TLS handshake: that port takes plain connections. Use "
                    "redis:// for it, or the port the server takes TLS on (its tls-port)")
