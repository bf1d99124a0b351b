"""Every Redis key name streamwork uses, and the rules for names; pure, no I/O.

All keys owned for stream ``S`` share one hash tag with ``S`` so each Lua script touches a
single Cluster slot: ``{S}:dead``, ``{S}:delayed``, ``{S}:done:<key>``, ``{S}:lock:<key>``,
``{S}:fence``. If ``S`` already carries a ``{tag}``, derived keys are ``S:<role>`` and reuse it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

import msgpack

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
        """The keys of ``stream``; raises ConfigError for a name streamwork does not accept."""
        check_name("stream", stream, allow_tag=True)
        return cls.of_any(stream)

    @classmethod
    def of_any(cls, stream: str) -> StreamKeys:
        """The keys of any stream name (one streamwork did not create, for inspection)."""
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


def is_dead_letter_stream(name: str) -> bool:
    """True for names of the ``{S}:dead`` form (dead letters of some stream ``S``)."""
    return name.endswith(":dead") and bool(_TAG.search(name[: -len(":dead")]))


def redlock_key(resource: str) -> str:
    """Key of the Redlock lock on ``resource`` on every master: ``redlock:{resource}``."""
    check_name("resource", resource)
    return "redlock:{" + resource + "}"


def redlock_fence_key(resource: str) -> str:
    """Key of the fencing counter of ``resource`` (same hash tag as its lock)."""
    return redlock_key(resource) + ":fence"


def redlock_resource(stream: str, key: str) -> str:
    """Name of the Redlock resource for job ``key`` of ``stream``: a digest, so that any
    job key the producer accepts (spaces, braces, any length) and any stream name work."""
    digest = hashlib.sha256(msgpack.packb([stream, key], use_bin_type=True)).hexdigest()
    return f"streamwork-{digest[:40]}"

