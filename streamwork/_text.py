"""Text about what user code raised, safe to log and to store in Redis; URLs without their
passwords, safe to show.

A worker calls user code in many places (handlers, payload validators, ``concurrency_key``,
hooks) and records what it raised in dead letters and job records. That text must never
fail to build: an exception's ``__str__`` may itself raise, and its message may hold lone
surrogates (a file name decoded with ``surrogateescape``), which UTF-8 cannot encode.
And the "did you mean" hint of a misspelt option name, and what to do when a server
refuses the URL's credentials.
"""

from __future__ import annotations

import difflib
import traceback
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit, urlunsplit


def text(value: object) -> str:
    """``str(value)``, or a placeholder if that raises; encodable as UTF-8 either way
    (characters it cannot encode are written as backslash escapes)."""
    try:
        shown = str.__str__(str(value))  # a plain str, even if __str__ gave a subclass
    except Exception as exc:
        shown = f"<str() raised {type(exc).__name__}>"
    return utf8(shown)


def utf8(value: str) -> str:
    """``value`` with what UTF-8 cannot encode (lone surrogates) as backslash escapes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def describe(exc: BaseException) -> str:
    """``<type>: <message>`` of an exception, safely."""
    return f"{type(exc).__name__}: {text(exc)}"


def error_detail(exc: BaseException, limit: int) -> str:
    """A failure's detail: the exception's message, then the last ``limit`` characters of
    its traceback."""
    try:
        trace = "".join(traceback.format_exception(exc))[-limit:]
    except Exception:  # a broken exception object; its type and message must do
        trace = ""
    return utf8(f"{text(exc)}\n{trace}")


def redact_url(url: str) -> str:
    """``url`` with its passwords (if any: in the user part, or a sentinel URL's
    ``sentinel_password``) replaced by ``***``, fit to show on a page or in a message."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL urllib can take apart: show no more than its scheme
        return url.partition("://")[0] + "://***"
    if parts.password is None and "password=" not in parts.query:
        return url
    if "password=" in parts.query:
        query = "&".join(f"{k}=***" if k.endswith("password") else f"{k}={v}"
                         for k, _, v in (item.partition("=") for item in parts.query.split("&")))
        parts = parts._replace(query=query)
    if parts.password is None:
        return urlunsplit(parts)
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def did_you_mean(name: str, names: Iterable[str], cutoff: float = 0.8) -> str:
    """``"; did you mean 'x'?"`` naming the one of ``names`` closest to ``name``, or "" when
    none is that near (0.8 catches one or two wrong letters: ``timout``, ``order_keys``)."""
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""


#: how a Redis URL carries credentials (the part users get wrong)
URL_FORM: Final = ("redis://:PASSWORD@HOST:PORT/DB, or redis://USER:PASSWORD@HOST:PORT/DB "
                   "for an ACL user (rediss:// for TLS; characters such as @ : / in the "
                   "password as %40 %3A %2F)")

#: Redis's words for "no credentials given, and the server needs some"
_NEEDS: Final = ("NOAUTH", "HELLO must be called with the client already authenticated",
                 "Authentication required")
#: ... and for "the credentials given are wrong"
_WRONG: Final = ("WRONGPASS", "invalid username-password pair", "invalid password")


def credentials_hint(exc: BaseException) -> str:
    """What to do if ``exc`` is a server refusing the client's credentials (none given where
    it needs a password, or wrong ones): a clause to add to a message, else "". Redis's
    own words (``NOAUTH``, ``HELLO must be called with the client already
    authenticated``, ``WRONGPASS``) name a protocol step, not the fix, which is the URL's
    user name and password. Read from the message of a redis-py error (every version
    keeps the server's words); "" for any other error, streamwork's own included (they
    say what to do themselves)."""
    if not type(exc).__module__.startswith("redis"):
        return ""
    message = text(exc)
    if any(word in message for word in _NEEDS):
        return f"the server needs a password: put it in the URL as {URL_FORM}"
    if "without any password configured" in message:
        return ("the URL has a password, but the server has none set: leave it out of the "
                "URL, or set one on the server (requirepass or an ACL user)")
    if any(word in message for word in _WRONG):
        return (f"the server refused the user name or password in the URL: check them; the "
                f"URL takes them as {URL_FORM}")
    return ""
