"""Text about what user code raised, safe to log and to store in Redis.

A worker calls user code in many places (handlers, payload validators, ``concurrency_key``,
hooks) and records what it raised in dead letters and job records. That text must never
fail to build: an exception's ``__str__`` may itself raise, and its message may hold lone
surrogates (a file name decoded with ``surrogateescape``), which UTF-8 cannot encode.
"""

from __future__ import annotations

import traceback


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
