"""Redis Sentinel URLs: ``redis+sentinel://host:port,host:port/service[/db]``.

A sentinel URL names the sentinels, not the primary: clients ask the sentinels for the
service's current primary whenever they open a connection (redis-py's
``SentinelConnectionPool``), so after a failover every new connection goes to the promoted
replica. Connections to the old primary fail (refused, reset, or ``READONLY`` once it is
demoted, which redis-py turns into a ConnectionError), and while no primary is elected the
sentinels answer "no master" (``MasterNotFoundError``, a ConnectionError): all transient
for `faults.classify`, so workers and producers back off and reconnect.

Syntax (``rediss+sentinel://`` for TLS to the sentinels and the primary)::

    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]
        [?sentinel_password=...&sentinel_username=...]
    rediss+sentinel://...[?ssl_ca_certs=...&ssl_certfile=...&ssl_keyfile=...]

The user and password are the primary's (and its replicas'); ``sentinel_password`` /
``sentinel_username`` those of the sentinels, when they ask for one. A port left out is
26379. The TLS options (`tls.OPTIONS`, redis-py's names) apply to the connections to the
sentinels and to the primary alike: one CA, one client certificate. A service no answering
sentinel monitors, sentinels refusing the credentials, or TLS that cannot work as
configured is a `ConfigError` (fatal), not an outage to wait out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl, unquote

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.exceptions
import redis.retry
import redis.sentinel
from redis.backoff import NoBackoff

from streamwork._redis import tls, tls_connections
from streamwork._text import redact_url
from streamwork.errors import ConfigError

SCHEMES: Final = ("redis+sentinel://", "rediss+sentinel://")
DEFAULT_PORT: Final = 26379
_QUERY: Final = ("sentinel_password", "sentinel_username", *tls.OPTIONS)
_FORM: Final = "redis+sentinel://host:port,host:port,host:port/service_name[/db]"


def is_sentinel_url(url: str) -> bool:
    """True for ``redis+sentinel://`` and ``rediss+sentinel://`` URLs."""
    return url.startswith(SCHEMES)


@dataclass(frozen=True)
class SentinelUrl:
    """A parsed sentinel URL: where the sentinels are and which service's primary to use."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    ssl: bool = False
    #: the TLS options of the query (redis-py's keyword arguments), for both kinds of node
    tls_options: tuple[tuple[str, Any], ...] = ()

    def primary_options(self) -> dict[str, Any]:
        """Connection options of the primary's connections (besides streamwork's own)."""
        options: dict[str, Any] = {"db": self.db}
        if self.username is not None:
            options["username"] = self.username
        if self.password is not None:
            options["password"] = self.password
        if self.ssl:
            options["ssl"] = True
            options.update(self.tls_options)
        return options

    def sentinel_options(self, base: dict[str, Any]) -> dict[str, Any]:
        """Connection options of the sentinels' connections: ``base``'s socket options.
        (The clients add no retries: a sentinel that does not answer is skipped for the
        next one, and the caller's backoff covers the rest.)"""
        options = {k: v for k, v in base.items() if k.startswith("socket_")}
        if self.sentinel_username is not None:
            options["username"] = self.sentinel_username
        if self.sentinel_password is not None:
            options["password"] = self.sentinel_password
        if self.ssl:
            options["ssl"] = True
            options.update(self.tls_options)
        return options


def _bad(url: str, why: str) -> ConfigError:
    return ConfigError("url", f"{redact_url(url)!r}: {why}; a sentinel URL looks like {_FORM} "
                              "(port 26379 if left out)")


def _host_port(url: str, item: str) -> tuple[str, int]:
    host, port = item, str(DEFAULT_PORT)
    if item.startswith("["):  # [::1]:26379
        host, _, rest = item[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise _bad(url, f"{item!r} is not host:port")
            port = rest[1:]
    elif ":" in item:
        host, _, port = item.rpartition(":")
    if not host:
        raise _bad(url, f"{item!r} names no host")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _bad(url, f"{item!r} has no valid port (1-65535)")
    return host, int(port)


def parse(url: str) -> SentinelUrl:
    """``url`` taken apart, or a ConfigError saying what is wrong with it."""
    if not is_sentinel_url(url):
        raise _bad(url, "the scheme is not redis+sentinel:// or rediss+sentinel://")
    rest = url.split("://", 1)[1]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        hosts, userinfo = netloc, ""
    items = [h for h in hosts.split(",")]
    if not hosts or any(not h for h in items):
        raise _bad(url, "no sentinel addresses (or an empty one between commas)")
    sentinels = tuple(_host_port(url, h) for h in items)
    parts = path.strip("/").split("/") if path.strip("/") else []
    if not parts:
        raise _bad(url, "no service name after the sentinel addresses")
    if len(parts) > 2:
        raise _bad(url, f"the path {path!r} has more than /service_name/db")
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise _bad(url, f"the database {parts[1]!r} is not a number")
        db = int(parts[1])
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    fields = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(fields) - set(_QUERY))
    if unknown:
        raise _bad(url, f"unknown option(s) {', '.join(unknown)} (known: {', '.join(_QUERY)})")
    return SentinelUrl(
        sentinels=sentinels, service=unquote(parts[0]), db=db, username=username,
        password=password, sentinel_username=fields.get("sentinel_username"),
        sentinel_password=fields.get("sentinel_password"),
        ssl=url.startswith("rediss+"),
        tls_options=tuple(tls.connection_options(fields).items()),
    )


#: what a sentinel answers to missing or wrong credentials
_REFUSED: Final = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError,
                   redis.exceptions.NoPermissionError)


def _misconfigured(spec: SentinelUrl, service: str,
                   answers: list[Any]) -> ConfigError | None:
    """After "no master": the URL's fault, if the sentinels' answers (their masters, or the
    error each raised) show one - credentials they refuse, or a service none of them
    monitors, TLS to every sentinel that cannot work as configured - rather than an outage
    to wait out (a primary down, no sentinel reachable)."""
    where = ", ".join(f"{h}:{p}" for h, p in spec.sentinels)
    for answer in answers:
        if isinstance(answer, _REFUSED) or (
                isinstance(answer, redis.exceptions.ResponseError)
                and str(answer).startswith(("NOAUTH", "WRONGPASS"))):
            return ConfigError("url", f"the sentinels at {where} refused the credentials "
                                      f"({type(answer).__name__}: {answer}); check "
                                      "sentinel_password (and sentinel_username) in the URL")
    refused = [answer for answer in answers if isinstance(answer, tls.TlsError)]
    if refused and len(refused) == len(answers):
        return refused[0]  # TLS to each sentinel cannot work as configured: it says why
    if any(isinstance(answer, BaseException) for answer in answers):
        return None
    if any(service in masters for masters in answers):
        return None
    known = sorted({str(name) for masters in answers for name in masters})
    return ConfigError("url", f"no sentinel at {where} monitors a service named "
                              f"{service!r} (they monitor: {', '.join(known) or 'nothing'});"
                              " check the service name in the URL")


class _SyncSentinel(redis.sentinel.Sentinel):
    """redis-py's Sentinel; "no master" becomes a ConfigError when the sentinels show the
    URL is at fault (`_misconfigured`): a typo is not an outage to wait out."""

    spec: SentinelUrl

    def discover_master(self, service_name: str) -> Any:
        try:
            return super().discover_master(service_name)  # type: ignore[no-untyped-call,unused-ignore]
        except redis.sentinel.MasterNotFoundError:
            answers: list[Any] = []
            for node in self.sentinels:
                try:
                    answers.append(node.sentinel_masters())
                except redis.RedisError as exc:
                    answers.append(exc)
            fault = _misconfigured(self.spec, service_name, answers)
            if fault is not None:
                raise fault from None
            raise


class _AsyncSentinel(redis.asyncio.sentinel.Sentinel):
    """The asyncio twin of `_SyncSentinel`."""

    spec: SentinelUrl

    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)
        except redis.asyncio.sentinel.MasterNotFoundError:
            answers: list[Any] = []
            for node in self.sentinels:
                try:
                    answers.append(await node.sentinel_masters())
                except redis.RedisError as exc:
                    answers.append(exc)
            fault = _misconfigured(self.spec, service_name, answers)
            if fault is not None:
                raise fault from None
            raise


class SentinelRedis(redis.Redis):
    """The primary's client; closing it closes the clients of the sentinels too."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            manager = getattr(self.connection_pool, "sentinel_manager", None)
            if manager is not None:
                manager.close()


class AsyncSentinelRedis(redis.asyncio.Redis):
    """The asyncio primary's client; ``aclose`` closes the sentinels' clients too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            manager = getattr(self.connection_pool, "sentinel_manager", None)
            if manager is not None:
                await manager.aclose()


def _tls_sentinels(spec: SentinelUrl, options: dict[str, Any], client_type: Any,
                   connection_class: type) -> list[Any]:
    """Clients of the sentinels over TLS, on `tls`'s connection classes (redis-py's
    Sentinel builds them on plain SSL connections, whose TLS misconfigurations look like
    sentinels that do not answer)."""
    given = {k: v for k, v in options.items() if k != "ssl"}
    return [client_type.from_url(f"rediss://{f'[{host}]' if ':' in host else host}:{port}",
                                 connection_class=connection_class, **given)
            for host, port in spec.sentinels]


def sync_client(url: str, **options: Any) -> SentinelRedis:
    """A sync client of the service's current primary; ``options`` as for ``redis.Redis``
    (the ``socket_*`` ones apply to the sentinels too)."""
    spec = parse(url)
    sentinel_options = spec.sentinel_options(options)
    sentinel_options["retry"] = redis.retry.Retry(NoBackoff(), 0)
    manager = _SyncSentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(spec.sentinels), sentinel_kwargs=sentinel_options,
        **{**options, **spec.primary_options(),
           **({"connection_class": tls_connections.SyncSentinelConnection} if spec.ssl else {})})
    manager.spec = spec
    if spec.ssl:
        manager.sentinels = _tls_sentinels(spec, sentinel_options, redis.Redis,
                                           tls_connections.SyncConnection)
    client: SentinelRedis = manager.master_for(  # type: ignore[no-untyped-call,unused-ignore]
        spec.service, redis_class=SentinelRedis)
    return client


def async_client(url: str, **options: Any) -> AsyncSentinelRedis:
    """An asyncio client of the service's current primary; see `sync_client`."""
    spec = parse(url)
    sentinel_options = spec.sentinel_options(options)
    sentinel_options["retry"] = redis.asyncio.retry.Retry(NoBackoff(), 0)
    if "maint_notifications_config" in options:
        sentinel_options["maint_notifications_config"] = options["maint_notifications_config"]
    manager = _AsyncSentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(spec.sentinels), sentinel_kwargs=sentinel_options,
        **{**options, **spec.primary_options(),
           **({"connection_class": tls_connections.AsyncSentinelConnection} if spec.ssl else {})})
    manager.spec = spec
    if spec.ssl:
        manager.sentinels = _tls_sentinels(spec, sentinel_options, redis.asyncio.Redis,
                                           tls_connections.AsyncConnection)
    client: AsyncSentinelRedis = manager.master_for(spec.service,
                                                    redis_class=AsyncSentinelRedis)
    return client
