"""Redis ACLs: a refused permission (``NOPERM``) turned into `PermissionDenied`, which names
the ACL user, what was refused and the ``ACL SETUSER`` line that would grant it.

`faults.denial` recognises the refusal (a command, a key, a command inside a script); this
module adds what the caller knows: the user (from the URL), the stream (so a refused key
is answered with the stream's key patterns, ``~S ~{S}:*``), and the streamwork script a
refusal happened in (`scripts` notes it on the exception), whose commands are listed when
Redis does not name the one refused (Redis 7.0 inside a script). One wording for every
caller: a worker's loops, the producer, the CLI and the dashboard.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import Final
from urllib.parse import unquote, urlsplit

from streamwork._redis import scripts
from streamwork._redis.faults import denial
from streamwork.errors import PermissionDenied

__all__ = ["explain", "explainer", "key_rules", "script_commands", "user_of"]

_CALL: Final = re.compile(r"redis\.p?call\('([A-Z]+)'(?:, *'([A-Z]+)')?")
#: commands whose second word is a subcommand (``XGROUP CREATE``: ``xgroup|create``)
_CONTAINERS: Final = frozenset({"XGROUP", "XINFO", "SCRIPT", "CLIENT", "OBJECT", "MEMORY"})
_FUNCTION: Final = re.compile(r"^local function (\w+)", re.MULTILINE)
#: what Redis adds to an error from inside a script: `` script: <sha>, on @user_script:N.``
_SCRIPT_TAIL: Final = re.compile(r"\s*script: [0-9a-f]{40}.*$", re.DOTALL)
_GLOB: Final = re.compile(r"([*?\[\]\\])")
#: scripts that also run the commands a handler staged (msg.stage)
_STAGING: Final = frozenset({"complete", "ack"})


def user_of(url: str) -> str:
    """The ACL user a streamwork URL logs in as (``default`` when it names none)."""
    try:
        name = urlsplit(url).username
    except ValueError:
        return "default"
    return unquote(name) if name else "default"


def _glob(text: str) -> str:
    """``text`` as a literal in a Redis glob pattern."""
    return _GLOB.sub(r"\\\1", text)


def key_rules(stream: str) -> str:
    """The key patterns that cover every key streamwork keeps for ``stream``:
    ``~S ~{S}:*`` (with the prefix a name carrying its own hash tag gets)."""
    from streamwork._wire.keys import StreamKeys

    prefix = StreamKeys.of_any(stream).prefix
    return f"~{_glob(stream)} ~{_glob(prefix)}:*"


def _stream_of(key: str) -> str:
    """The stream a streamwork key belongs to (``{orders}:job:...`` -> ``orders``; a key
    without a hash tag in front is taken for the stream itself)."""
    if not key.startswith("{") or "}" not in key:
        return key
    tag, _, rest = key[1:].partition("}")
    if rest.startswith("~"):  # {tag}~<len>:S:role...: a name carrying its own tag
        size, _, tail = rest[1:].partition(":")
        if size.isdigit():
            return tail.encode("utf-8")[:int(size)].decode("utf-8", "replace")
    return tag


def _commands(lua: str) -> set[str]:
    """The commands ``lua`` calls, as ACL rules name them (``get``, ``xgroup|create``)."""
    return {(a + ("|" + b if b and a in _CONTAINERS else "")).lower()
            for a, b in _CALL.findall(lua)}


@functools.cache
def _lib() -> dict[str, str]:
    """The functions of the shared prelude ``lib.lua``: name -> body."""
    parts = _FUNCTION.split(scripts.lua_text("lib"))
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@functools.cache
def script_commands(name: str) -> tuple[str, ...]:
    """The commands streamwork's Lua script ``name`` may run (its own, and those of the
    prelude functions it calls), as ACL rules name them, sorted."""
    lib, todo, seen = _lib(), [scripts.lua_text(scripts.file_of(name))], set()
    found: set[str] = set()
    while todo:
        lua = todo.pop()
        found |= _commands(lua)
        for fn, body in lib.items():
            if fn not in seen and re.search(rf"\b{fn}\(", lua):
                seen.add(fn)
                todo.append(body)
    return tuple(sorted(found))


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def explain(exc: BaseException, url: str, *, stream: str | None = None,
            keys: Iterable[object] = (), command: str | None = None,
            ) -> PermissionDenied | None:
    """`PermissionDenied` for a refused permission (``exc`` as Redis raised it, or already
    explained), else None. ``url``: the caller's (its user); ``stream``: the stream it
    works on, if one; ``keys``: the keys of the refused call, where the caller knows them
    (a script's are noted on the exception by `scripts`); ``command``: the command it sent,
    where the caller knows it (a refused key is then told with it: a command granted on
    some keys only, in a selector, is refused as a key)."""
    if isinstance(exc, PermissionDenied):
        return exc
    refusal = denial(exc)
    if refusal is None:
        return None
    user = user_of(url)
    script = str(getattr(exc, scripts.NOTED_SCRIPT, "") or "")
    used = tuple(_text(k) for k in (getattr(exc, scripts.NOTED_KEYS, None) or keys))
    where = f" in streamwork's {script} script" if script else ""
    detail = _SCRIPT_TAIL.sub("", refusal.text)
    if refusal.command:
        refused = f"the '{refusal.command}' command{where}"
        grant = f"grant it with `ACL SETUSER {user} +{refusal.command}`"
    elif refusal.key:
        streams = [stream] if stream else list(dict.fromkeys(_stream_of(k) for k in used))
        rules = " ".join(key_rules(s) for s in streams)
        of = (f" of stream {streams[0]!r}" if len(streams) == 1
              else f" (one of {', '.join(repr(k) for k in used)})" if used else "")
        if command and not script:
            refused = f"the '{command}' command on a key{of}"
            grant = (f"grant it on the stream's keys with `ACL SETUSER {user} +{command} "
                     f"{rules}`" if rules else
                     f"grant it on the keys of the streams it works on (+{command} "
                     "~S ~{S}:* for stream S)")
            grant += (" (a key is refused too when the user has the command only on other "
                      "keys, in a selector)")
        else:
            refused = f"a key{of}{where}"
            grant = (f"grant the stream's keys with `ACL SETUSER {user} {rules}`" if rules
                     else "grant the keys of the streams it works on (~S ~{S}:* for "
                     "stream S)")
    elif script:
        runs = script_commands(script)
        staged = " and those your handlers stage" if script in _STAGING else ""
        refused = (f"a command{where} (it runs {', '.join(runs)}{staged}; Redis 7.0 does "
                   "not say which one)")
        grant = ("grant what it runs with `ACL SETUSER "
                 f"{user} {' '.join('+' + c for c in runs)}`")
    else:
        refused = "a command"
        grant = "see `ACL LOG` on the server for what was refused, and grant it"
    return PermissionDenied(user, refused, grant, detail,
                            command=refusal.command or (None if script else command),
                            keys=used, script=script)


def explainer(url: str, stream: str | None = None,
              ) -> Callable[[BaseException], PermissionDenied | None]:
    """`explain` bound to a caller's URL and stream (a worker's supervisors take it)."""
    return functools.partial(explain, url=url, stream=stream)
