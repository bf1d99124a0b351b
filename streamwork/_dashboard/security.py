"""The dashboard's guard: token login, CSRF tokens, a Host check and security headers.

- **Token.** With a token (required by the CLI when the dashboard binds to anything but
  loopback) every request must carry it: an ``Authorization: Bearer <token>`` header, or
  the login cookie set by opening any page with ``?token=<token>`` once (the server then
  redirects to the same page without the token in the address). Otherwise: 401.
- **CSRF.** Every browser gets a random session cookie; each form carries
  ``HMAC(server secret, session)`` in a hidden ``csrf`` field, and a POST whose field does
  not match its cookie, or whose ``Origin`` is another site, is refused with 403 (a
  signed double-submit cookie). A request authenticated by the ``Authorization`` header is
  exempt: another site's page cannot make a browser send that header.
- **Host.** Without a token (loopback only) the ``Host`` header must name a loopback
  address or ``localhost``, so a DNS-rebinding page cannot read the dashboard.
- **Headers.** A Content-Security-Policy allowing only this response's inline style and
  script (by nonce) and same-origin forms, ``X-Frame-Options: DENY``, ``nosniff``, the
  referrer only to this origin (with ``no-referrer`` browsers send ``Origin: null`` with
  the forms), no caching.

Cookies are ``HttpOnly; SameSite=Strict`` and their names carry the server's port, so two
dashboards on one host do not log each other out.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

from starlette.exceptions import HTTPException
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

__all__ = ["CSRF_FIELD", "Guard", "GuardMiddleware", "is_loopback"]

CSRF_FIELD: Final = "csrf"  #: the hidden form field holding the CSRF token
TOKEN_PARAM: Final = "token"  #: the query parameter of the token login
_AUTH_LABEL: Final = b"streamwork-dashboard-auth"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (``127.0.0.0/8``, ``::1``)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(host_header: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8321`` -> ``::1``)."""
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rpartition(":")[0] if host_header.count(":") == 1 else host_header


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class Guard:
    """What a request must show: the token (when there is one) and, to act, a CSRF token."""

    def __init__(self, token: str | None, secret: bytes | None = None) -> None:
        self.token = token or None
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        # the login cookie holds a digest of the token, never the token itself
        self._auth_cookie_value = (
            None if self.token is None
            else hmac.new(self.token.encode(), _AUTH_LABEL, hashlib.sha256).hexdigest())

    @staticmethod
    def cookie(request: Request, base: str) -> str:
        """The cookie name ``base`` for this server (its port appended)."""
        server = request.scope.get("server") or ("", 0)
        return f"{base}_{server[1]}"

    def bearer_ok(self, request: Request) -> bool:
        """The request carries ``Authorization: Bearer <token>``."""
        if self.token is None:
            return False
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and _same(value.strip(), self.token)

    def authorized(self, request: Request) -> bool:
        """No token is set, or the request shows it (header or login cookie)."""
        if self.token is None or self.bearer_ok(request):
            return True
        value = request.cookies.get(self.cookie(request, "streamwork_auth"), "")
        return self._auth_cookie_value is not None and _same(value, self._auth_cookie_value)

    def csrf_token(self, session: str) -> str:
        """The form token of ``session``: HMAC of the session id with the server secret."""
        return hmac.new(self._secret, session.encode(), hashlib.sha256).hexdigest()

    def check_post(self, request: Request, submitted: Any) -> None:
        """Raise 403 unless this POST comes from one of our own pages (or shows the token
        in its Authorization header)."""
        if self.bearer_ok(request):
            return
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
            raise HTTPException(403, f"refused: the form was sent from another site "
                                     f"({origin}); use the dashboard's own page")
        session = request.cookies.get(self.cookie(request, "streamwork_session"), "")
        if not (session and isinstance(submitted, str) and submitted
                and _same(submitted, self.csrf_token(session))):
            raise HTTPException(403, "refused: the form's CSRF token is missing or stale "
                                     "(the dashboard restarted, or cookies are off); reload "
                                     "the page and try again")

    def login_cookie_value(self) -> str:
        assert self._auth_cookie_value is not None
        return self._auth_cookie_value


def security_headers(response: Response, nonce: str) -> None:
    """Set the headers every response carries."""
    response.headers["Content-Security-Policy"] = (
        f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; "
        "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"


def _set_cookie(response: Response, name: str, value: str) -> None:
    response.set_cookie(name, value, httponly=True, samesite="strict", path="/")


class GuardMiddleware(BaseHTTPMiddleware):
    """Applies a :class:`Guard` to every request; endpoints read ``request.state.nonce``
    and ``request.state.csrf`` (the page's form token)."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        super().__init__(app)
        self.guard = guard

    async def dispatch(self, request: Request,
                       call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        nonce = secrets.token_urlsafe(16)
        response = await self._answer(request, call_next, nonce)
        security_headers(response, nonce)
        return response

    async def _answer(self, request: Request,
                      call_next: Callable[[Request], Awaitable[Response]],
                      nonce: str) -> Response:
        guard = self.guard
        if guard.token is None:
            host = request.headers.get("host", "")
            if not is_loopback(_host_name(host)):
                return PlainTextResponse(
                    f"refused: Host {host!r} is not a loopback address; this dashboard has no "
                    "token, so it answers only at 127.0.0.1 / localhost", 403)
        else:
            given = request.query_params.get(TOKEN_PARAM)
            if given is not None:
                return self._login(request, given)
            if not guard.authorized(request):
                return PlainTextResponse(
                    "this dashboard needs its token: open any page once with ?token=<token> "
                    "(sets a cookie), or send 'Authorization: Bearer <token>'", 401,
                    headers={"WWW-Authenticate": 'Bearer realm="streamwork dashboard"'})
        session_name = guard.cookie(request, "streamwork_session")
        session = request.cookies.get(session_name) or ""
        fresh = not session
        if fresh:
            session = secrets.token_urlsafe(24)
        request.state.nonce = nonce
        request.state.csrf = guard.csrf_token(session)
        response = await call_next(request)
        if fresh:
            _set_cookie(response, session_name, session)
        return response

    def _login(self, request: Request, given: str) -> Response:
        """``?token=``: a matching token sets the login cookie and redirects to the page
        without the token in its address; a wrong one is refused."""
        guard = self.guard
        assert guard.token is not None
        if not _same(given, guard.token):
            return PlainTextResponse("refused: wrong token", 401,
                                     headers={"WWW-Authenticate": "Bearer"})
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != TOKEN_PARAM]
        target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
        response = RedirectResponse(target, status_code=303)
        _set_cookie(response, guard.cookie(request, "streamwork_auth"),
                    guard.login_cookie_value())
        return response
