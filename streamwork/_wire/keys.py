"""Every Redis key name streamwork uses, and the rules for names; pure, no I/O.

Layout version 2. All keys owned for stream ``S`` start with ``S``'s hash tag, so each Lua
script touches one Cluster slot. For a plain name (prefix ``{S}``): ``{S}:dead``,
``{S}:delayed``, ``{S}:fence``; per group ``G``: ``{S}:retry:<len(G)>:G`` (stream),
``{S}:retries:<len(G)>:G`` (ZSET), and one job record per job key ``K``:
``{S}:job:<len(G)>:G:K``; ordered mode adds ``{S}:owner:<len(G)>:G`` (the partition's
lease) and ``{S}:members:<len(G)>:G`` (the group's live workers, on the base stream);
every group has ``{S}:settings:<len(G)>:G`` (what its workers declare, for cancel); a paused
group has ``{S}:paused:<len(G)>:G`` (why and since when).
Periodic jobs add ``{S}:tick:<len(G)>:G:<schedule>`` (its last tick decided) and
``{S}:schedules:<len(G)>:G`` (the schedules the group's workers publish). Job chains on
Redis Cluster add ``{S}:outbox`` (jobs sent to other slots, not moved yet) and, on a
target ``T``, ``{T}:chained:<len(S)>:S`` (the last outbox entry of ``S`` moved to ``T``).
Each send leaves ``{S}:sent:<token>`` for a minute or so (its marker: retried after a
lost reply, it stores nothing twice).
Jobs sent at priority ``high`` or ``low`` go onto ``{S}:p:high`` / ``{S}:p:low``
(``_wire/priorities.py``); ``normal`` ones onto ``S`` itself.
A name carrying its own tag (``{orders}:eu``) gets the prefix
``{orders}~<len(S)>:S`` instead. Lengths in front of names make the layout injective: two
different (stream, group, job key) triples never share a key, whatever characters they hold.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

import msgpack

from streamwork.errors import ConfigError

MAX_NAME_BYTES: Final = 200  #: longest stream/group/consumer name accepted, in UTF-8 bytes
_TAG: Final = re.compile(r"\{([^{}]+)\}")
_BAD_CHARS: Final = re.compile(r"[\s\x00]")
#: names of keys derived from some stream (see StreamKeys); never a stream of its own
_OWNED: Final = re.compile(
    r"^\{[^{}]+\}(~|:(dead|delayed|fence|partitions|outbox)$"
    r"|:(retry|retries|job|owner|members|rate|sem|tick|schedules|settings|chained|p|paused"
    r"|progress|join|join-results|sent):)")


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


def _lp(text: str) -> str:
    """``text`` with its length in front (``7:billing``), so what follows it in a key can
    never be mistaken for part of it: the key layout stays injective whatever characters
    names and job keys hold."""
    return f"{len(text.encode('utf-8'))}:{text}"  # bytes, as Lua's # counts them


@dataclass(frozen=True, slots=True)
class StreamKeys:
    """The key names of one stream; build with ``StreamKeys.for_stream(name)``.

    ``tag`` is the stream's hash tag in braces (``{S}``, or the tag the name carries) and
    every key starts with it, so all of them live in the stream's Cluster slot. ``prefix``
    is what comes before each key's role: ``{S}`` for a plain name, and ``{tag}~<len>:S``
    for a name with its own tag (so streams ``orders`` and ``{orders}`` share nothing)."""

    stream: str
    prefix: str
    tag: str

    @classmethod
    def for_stream(cls, stream: str) -> StreamKeys:
        """The keys of ``stream``; raises ConfigError for a name streamwork does not accept
        (among them the names of keys streamwork owns, e.g. ``{orders}:dead``)."""
        check_name("stream", stream, allow_tag=True)
        if _OWNED.match(stream):
            raise ConfigError("stream", f"{stream!r} is the name of a key streamwork keeps for "
                                        "another stream (dead letters, retries, job records); "
                                        "pick another name")
        return cls.of_any(stream)

    @classmethod
    def of_any(cls, stream: str) -> StreamKeys:
        """The keys of any stream name (one streamwork did not create, for inspection)."""
        found = _TAG.search(stream)
        if found is None:
            tag = "{" + stream + "}"
            return cls(stream=stream, prefix=tag, tag=tag)
        tag = found.group(0)
        return cls(stream=stream, prefix=f"{tag}~{_lp(stream)}", tag=tag)

    @property
    def dead(self) -> str:
        """Dead-letter stream (every group's; each entry names its group)."""
        return f"{self.prefix}:dead"

    @property
    def delayed(self) -> str:
        """ZSET of new jobs sent with ``delay=``/``at=``, scored by due time (Unix ms); due
        ones go onto the stream, so every group gets them."""
        return f"{self.prefix}:delayed"

    @property
    def fence(self) -> str:
        """Counter that hands out fencing tokens."""
        return f"{self.prefix}:fence"

    @property
    def partitions(self) -> str:
        """How many partitions this stream is split into, as its first partitioned producer
        or worker recorded it (absent: not partitioned); a mismatch is refused."""
        return f"{self.prefix}:partitions"

    def sent(self, token: str) -> str:
        """A send's marker (``token``: random, one per call), kept a minute or so: the call
        repeated after its reply was lost finds it and stores nothing twice."""
        return f"{self.prefix}:sent:{token}"

    @property
    def outbox(self) -> str:
        """Redis Cluster: jobs this stream's handlers sent (``msg.send``) to streams in other
        slots, staged here with the acknowledgement and moved to their targets by the
        workers (each entry deleted once its job is on the target)."""
        return f"{self.prefix}:outbox"

    def chained(self, source: str) -> str:
        """Redis Cluster, on a target stream: the last entry id of ``source``'s outbox
        moved here, so moving an entry again (after a crash) adds nothing."""
        return f"{self.prefix}:chained:{_lp(source)}"

    def join(self, key: str) -> str:
        """The record of join ``key`` whose callback goes to this stream: how many children
        it waits for, how many ended, the callback's body, whether it fired."""
        return f"{self.prefix}:join:{_lp(key)}"

    def join_results(self, key: str) -> str:
        """How each child of join ``key`` ended, by child index (what its callback reads
        with ``msg.join_results``)."""
        return f"{self.prefix}:join-results:{_lp(key)}"

    @property
    def retry_prefix(self) -> str:
        """What every group's retry stream starts with (replay.lua adds the group)."""
        return f"{self.prefix}:retry:"

    def group(self, group: str) -> GroupKeys:
        """The keys of consumer group ``group`` of this stream."""
        check_name("group", group)
        return GroupKeys(self, group)


@dataclass(frozen=True, slots=True)
class GroupKeys:
    """The keys of one consumer group: its retries, replays and job records are its own
    business, never another group's (a retry reaches only the group that failed)."""

    stream: StreamKeys
    name: str

    @property
    def retry(self) -> str:
        """The group's retry stream: due retries and replayed dead letters, read in the
        same XREADGROUP call as the stream itself (by a consumer group of the same name)."""
        return self.stream.retry_prefix + _lp(self.name)

    @property
    def retries(self) -> str:
        """ZSET of the group's retries waiting for their backoff, scored by due time."""
        return f"{self.stream.prefix}:retries:{_lp(self.name)}"

    @property
    def job_prefix(self) -> str:
        """What the job records of this group start with; a record is this + the job key."""
        return f"{self.stream.prefix}:job:{_lp(self.name)}:"

    @property
    def settings(self) -> str:
        """Hash of what the group's workers declare at start (``dedup``: "1" or "0"), read
        by cancel.lua to say plainly when a cancel can have no effect."""
        return f"{self.stream.prefix}:settings:{_lp(self.name)}"

    @property
    def paused(self) -> str:
        """Hash saying the group is paused (``reason``, ``since`` in Unix ms), absent while it
        runs: its workers read it once a second and start no job while it is there."""
        return f"{self.stream.prefix}:paused:{_lp(self.name)}"

    @property
    def owner(self) -> str:
        """Ordered mode: the lease naming the worker that owns this stream (partition) for
        the group; it alone reads and runs its jobs."""
        return f"{self.stream.prefix}:owner:{_lp(self.name)}"

    @property
    def members(self) -> str:
        """Ordered mode, on the base stream: ZSET of the group's live workers (score: when
        each one's membership lapses, Unix ms); partitions are shared out among them."""
        return f"{self.stream.prefix}:members:{_lp(self.name)}"

    @property
    def rate(self) -> str:
        """The group's token bucket (``rate_limit``), shared by all its workers."""
        return f"{self.stream.prefix}:rate:{_lp(self.name)}"

    def semaphore(self, concurrency_key: str) -> str:
        """The holders of one concurrency key (``concurrency_key``/``concurrency_per_key``)."""
        return f"{self.stream.prefix}:sem:{_lp(self.name)}:{concurrency_key}"

    def job(self, key: str) -> str:
        """The job record of job ``key`` in this group: the lease while it runs, then its
        done record (result), or its waiting / dead state."""
        return self.job_prefix + key

    @property
    def progress_prefix(self) -> str:
        """What the progress records of this group start with (+ the job key)."""
        return f"{self.stream.prefix}:progress:{_lp(self.name)}:"

    def progress(self, key: str) -> str:
        """The last progress job ``key``'s handler reported (``msg.progress``), written with
        a heartbeat and kept a visibility timeout past the last one."""
        return self.progress_prefix + key

    def tick(self, schedule: str) -> str:
        """Periodic jobs: the latest tick (Unix ms) of the group's schedule ``schedule``
        that is decided (enqueued, or skipped by ``catch_up``); tick.lua checks and moves
        it in the step that enqueues, so each tick is enqueued once across all workers."""
        return f"{self.stream.prefix}:tick:{_lp(self.name)}:{schedule}"

    @property
    def schedules(self) -> str:
        """Periodic jobs, on the base stream: HASH of the group's schedules as its workers
        publish them (schedule name -> JSON), read by ``streamwork schedules``."""
        return f"{self.stream.prefix}:schedules:{_lp(self.name)}"


def is_owned_key(name: str) -> bool:
    """True for names of keys streamwork derives from some stream (dead letters, a group's
    retry stream or ZSET, job records, ...), which are never streams of their own."""
    return bool(_OWNED.match(name))


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


def check_utf8(option: str, text: str) -> str:
    """``text`` if it encodes as UTF-8, else ConfigError naming ``option``: a lone surrogate
    (what decoding bytes with ``errors="surrogateescape"`` leaves) cannot be sent or stored."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(option, (
            f"{text!r} is not valid UTF-8 text: it holds the lone surrogate "
            f"{text[exc.start]!r} at index {exc.start} (bytes decoded with "
            "errors='surrogateescape'?); job keys and order keys must be valid UTF-8 "
            "text")) from None
    return text
