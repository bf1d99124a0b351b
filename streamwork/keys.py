"""Every Redis key name streamwork uses, and the rules for names; pure, no I/O.

All keys owned for stream ``S`` share one hash tag with ``S`` so each Lua script touches a
single Cluster slot: ``{S}:dead``, ``{S}:delayed``, ``{S}:done:<key>``, ``{S}:lock:<key>``,
``{S}:fence``. If ``S`` already carries a ``{tag}``, derived keys are ``S:<role>`` and reuse it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from .errors import ConfigError

MAX_NAME_BYTES: Final = 200  #: longest stream/group/consumer name accepted, in UTF-8 bytes
_TAG: Final = re.compile(r"\{([^{}]+)\}")
_BAD_CHARS: Final = re.compile(r"[\s\x00]")


def check_name(option: str, name: object, *, allow_tag: bool = False) -> str:
    """Return ``name`` if it is a usable stream/group/consumer name, else raise ConfigError."""
    if not isinstance(name, str):
        raise ConfigError(option, f"must be a str, got {type(name).__name__}")
    if not name:
        raise ConfigError(option, "must not be empty")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise ConfigError(option, f"must be at most {MAX_NAME_BYTES} bytes of UTF-8")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(option, "must be valid UTF-8 text") from None
    if _BAD_CHARS.search(name):
        raise ConfigError(option, f"{name!r} contains whitespace or NUL; use e.g. '-' or '.'")
    if "{" in name or "}" in name:
        braces_ok = allow_tag and name.count("{") == 1 and name.count("}") == 1
        if not (braces_ok and _TAG.search(name)):
            raise ConfigError(
                option,
                f"{name!r}: braces are only allowed as one non-empty hash tag like "
                "'{orders}:eu' (and only in stream names)",
            )
    return name


@dataclass(frozen=True, slots=True)
class StreamKeys:
    """The key names of one stream; build with ``StreamKeys.for_stream(name)``."""

    stream: str
    prefix: str

    @classmethod
    def for_stream(cls, stream: str) -> StreamKeys:
        check_name("stream", stream, allow_tag=True)
        prefix = stream if _TAG.search(stream) else "{" + stream + "}"
        return cls(stream=stream, prefix=prefix)

    @property
    def dead(self) -> str:
        """Dead-letter stream."""
        return f"{self.prefix}:dead"

    @property
    def delayed(self) -> str:
        """ZSET of jobs due later (retries and delayed sends), scored by due time in ms."""
        return f"{self.prefix}:delayed"

    @property
    def fence(self) -> str:
        """Counter that hands out fencing tokens."""
        return f"{self.prefix}:fence"

    @property
    def done_prefix(self) -> str:
        return f"{self.prefix}:done:"

    @property
    def lock_prefix(self) -> str:
        return f"{self.prefix}:lock:"

    def done(self, key: str) -> str:
        """Done-marker of job ``key``."""
        return f"{self.prefix}:done:{key}"

    def lock(self, key: str) -> str:
        """Job lease of job ``key``."""
        return f"{self.prefix}:lock:{key}"


def key_slot(key: str | bytes) -> int:
    """Redis Cluster hash slot of ``key`` (CRC16/XMODEM of its hash tag, mod 16384)."""
    raw = key.encode() if isinstance(key, str) else key
    start = raw.find(b"{")
    if start != -1:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    crc = 0
    for byte in raw:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc % 16384
