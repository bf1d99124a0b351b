"""redis-py's connection classes with TLS misconfigurations diagnosed (`tls.diagnose`):
`SyncConnection` and `AsyncConnection` for ``rediss://`` URLs, `SyncSentinelConnection`
and `AsyncSentinelConnection` for the primary of a ``rediss+sentinel://`` URL. A
connection that fails as no outage would (see `streamwork._redis.tls`) raises
`tls.TlsError`; after the handshake an unexplained EOF or reset is probed once (`_probe`:
one more connection that listens for the server's alert), and a handshake that times out
is asked a plain ``PING`` (`_plain_probe`: a port without TLS answers it)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Any

import redis.asyncio.connection
import redis.asyncio.sentinel
import redis.connection
import redis.exceptions
import redis.sentinel

from streamwork._redis import tls
from streamwork._redis.tls import TlsError


class _SyncDiagnosis:
    """Mixin for redis-py's sync SSL connection classes: a failure to connect that is a TLS
    misconfiguration raises `tls.TlsError`. (``connect`` and ``on_connect`` for redis-py 5;
    ``connect_check_health`` and ``on_connect_check_health`` for 6 and later.)"""

    def connect(self, *args: Any, **kwargs: Any) -> Any:
        if hasattr(super(), "connect_check_health"):  # redis-py 6+: diagnosed in there
            return super().connect(*args, **kwargs)  # type: ignore[misc]
        try:
            return super().connect(*args, **kwargs)  # type: ignore[misc]
        except TlsError:
            raise
        except (redis.exceptions.ConnectionError, OSError) as exc:
            self._raise_diagnosed(exc)
            raise
        except redis.exceptions.TimeoutError as exc:
            fault = self._plain_probe(tls.Peer(self))
            if fault is not None:
                raise fault from exc
            raise

    def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
        except TlsError:
            raise
        except (redis.exceptions.ConnectionError, OSError) as exc:
            self._raise_diagnosed(exc)
            raise
        except redis.exceptions.TimeoutError as exc:
            fault = self._plain_probe(tls.Peer(self))
            if fault is not None:
                raise fault from exc
            raise

    def on_connect(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().on_connect(*args, **kwargs)  # type: ignore[misc]
        except TlsError:
            raise
        except (redis.exceptions.ConnectionError, OSError) as exc:
            self._raise_diagnosed(exc, handshaken=True)
            raise

    def on_connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().on_connect_check_health(*args, **kwargs)  # type: ignore[misc]
        except TlsError:
            raise
        except (redis.exceptions.ConnectionError, OSError) as exc:
            self._raise_diagnosed(exc, handshaken=True)
            raise

    def _raise_diagnosed(self, exc: BaseException, *, handshaken: bool = False) -> None:
        peer = tls.Peer(self)
        fault = tls.diagnose(exc, peer)
        if fault is None and handshaken and tls.after_handshake(exc):
            fault = self._probe(peer)
        if fault is not None:
            raise fault from exc

    def _probe(self, peer: tls.Peer) -> TlsError | None:
        """Connect once more as redis-py does (TCP, TLS handshake), send nothing, and
        listen `tls.PROBE_SECONDS` for an alert saying why the server refuses this client."""
        try:
            sock: socket.socket = self._connect()  # type: ignore[attr-defined]
        except Exception:
            return None
        try:
            sock.settimeout(tls.PROBE_SECONDS)
            sock.recv(1)
        except ssl.SSLError as err:
            return tls.diagnose(err, peer)
        except OSError:
            return None
        finally:
            with contextlib.suppress(OSError):
                sock.close()
        return None


    def _plain_probe(self, peer: tls.Peer) -> TlsError | None:
        """After a timeout connecting: whether the port answers a plain ``PING`` (a
        ``rediss://`` URL naming a port without TLS: the handshake waits for an answer
        that never comes). Nothing is said when it does not answer either (an outage)."""
        try:
            address = (str(getattr(self, "host", "")), int(getattr(self, "port", 0)))
            with socket.create_connection(address, timeout=tls.PROBE_SECONDS) as sock:
                sock.settimeout(tls.PROBE_SECONDS)
                sock.sendall(b"PING\r\n")
                reply = sock.recv(16)
        except OSError:
            return None
        return tls.plain_answer(reply, peer)


class _AsyncDiagnosis:
    """The asyncio twin of `_SyncDiagnosis` (its probe does not block the event loop)."""

    async def connect(self, *args: Any, **kwargs: Any) -> Any:
        if hasattr(super(), "connect_check_health"):  # redis-py 6+: diagnosed in there
            return await super().connect(*args, **kwargs)  # type: ignore[misc]
        try:
            return await super().connect(*args, **kwargs)  # type: ignore[misc]
        except TlsError:
            raise
        except (redis.exceptions.ConnectionError, OSError) as exc:
            await self._raise_diagnosed(exc)
            raise
        except redis.exceptions.TimeoutError as exc:
            fault = await self._plain_probe(tls.Peer(self))
            if fault is not None:
                raise fault from exc
            raise

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
        except TlsError:
            raise
        except (redis.exceptions.ConnectionError, OSError) as exc:
            await self._raise_diagnosed(exc)
            raise
        except redis.exceptions.TimeoutError as exc:
            fault = await self._plain_probe(tls.Peer(self))
            if fault is not None:
                raise fault from exc
            raise

    async def on_connect(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().on_connect(*args, **kwargs)  # type: ignore[misc]
        except TlsError:
            raise
        except (redis.exceptions.ConnectionError, OSError) as exc:
            await self._raise_diagnosed(exc, handshaken=True)
            raise

    async def on_connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().on_connect_check_health(*args, **kwargs)  # type: ignore[misc]
        except TlsError:
            raise
        except (redis.exceptions.ConnectionError, OSError) as exc:
            await self._raise_diagnosed(exc, handshaken=True)
            raise

    async def _raise_diagnosed(self, exc: BaseException, *, handshaken: bool = False) -> None:
        peer = tls.Peer(self)
        fault = tls.diagnose(exc, peer)
        if fault is None and handshaken and tls.after_handshake(exc):
            fault = await self._probe(peer)
        if fault is not None:
            raise fault from exc

    async def _probe(self, peer: tls.Peer) -> TlsError | None:
        """See `_SyncDiagnosis._probe`."""
        host, port = getattr(self, "host", None), getattr(self, "port", None)
        try:
            context = self.ssl_context.get()  # type: ignore[attr-defined]
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=context, server_hostname=host),
                tls.PROBE_SECONDS * 5)
        except Exception:
            return None
        try:
            await asyncio.wait_for(reader.read(1), tls.PROBE_SECONDS)
        except ssl.SSLError as err:
            return tls.diagnose(err, peer)
        except (OSError, asyncio.TimeoutError):
            return None
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        return None


    async def _plain_probe(self, peer: tls.Peer) -> TlsError | None:
        """See `_SyncDiagnosis._plain_probe`."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                getattr(self, "host", None), getattr(self, "port", None)), tls.PROBE_SECONDS)
        except (OSError, asyncio.TimeoutError):
            return None
        try:
            writer.write(b"PING\r\n")
            await writer.drain()
            reply = await asyncio.wait_for(reader.read(16), tls.PROBE_SECONDS)
        except (OSError, asyncio.TimeoutError):
            return None
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        return tls.plain_answer(reply, peer)


class SyncConnection(_SyncDiagnosis, redis.connection.SSLConnection):
    """redis-py's SSLConnection, its TLS misconfigurations raised as `tls.TlsError`."""


class AsyncConnection(_AsyncDiagnosis, redis.asyncio.connection.SSLConnection):
    """redis-py's asyncio SSLConnection, its TLS misconfigurations raised as `tls.TlsError`."""


class SyncSentinelConnection(_SyncDiagnosis, redis.sentinel.SentinelManagedSSLConnection):
    """A sentinel-managed primary's SSL connection, diagnosed likewise."""


class AsyncSentinelConnection(_AsyncDiagnosis,
                              redis.asyncio.sentinel.SentinelManagedSSLConnection):
    """The asyncio sentinel-managed primary's SSL connection, diagnosed likewise."""
