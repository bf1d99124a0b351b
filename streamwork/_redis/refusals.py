"""What to do when a server refuses a client's credentials: Redis's own words (``NOAUTH``,
``HELLO must be called with the client already authenticated``, ``WRONGPASS``) name a
protocol step, not the fix, which is the URL's user name and password."""

from __future__ import annotations

from typing import Final

import redis.exceptions

#: how a URL carries credentials (the part users get wrong)
URL_FORM: Final = ("redis://:PASSWORD@HOST:PORT/DB, or redis://USER:PASSWORD@HOST:PORT/DB "
                   "for an ACL user (rediss:// for TLS; characters such as @ : / in the "
                   "password as %40 %3A %2F)")

_NEEDS: Final = ("NOAUTH", "HELLO must be called with the client already authenticated",
                 "Authentication required")
_WRONG: Final = ("WRONGPASS", "invalid username-password pair", "invalid password",
                 "AUTH <password> called without any password configured")


def credentials_hint(exc: BaseException) -> str:
    """What to do about ``exc`` if it is the server refusing the credentials (none given
    where it needs some, or wrong ones): a sentence to append to a message; else ""."""
    if not isinstance(exc, (redis.exceptions.AuthenticationError,
                            redis.exceptions.ResponseError)):
        return ""
    message = str(exc)
    if any(word in message for word in _NEEDS):
        return f"the server needs a password: put it in the URL as {URL_FORM}"
    if "without any password configured" in message:
        return ("the URL has a password, but the server has none set: leave it out of the "
                "URL, or set one on the server (requirepass or an ACL user)")
    if any(word in message for word in _WRONG):
        return (f"the server refused the user name or password in the URL: check them; the "
                f"URL takes them as {URL_FORM}")
    return ""
