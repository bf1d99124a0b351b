"""Every Lua script of streamwork: loaded once, registered per client (EVALSHA), one typed
method per script.

The only loader: workers, producers, the dead-letter tools and Redlock all call their
scripts through here. One ARGV convention: scalar arguments first, then (where a script
works on a batch) ONE MessagePack argument holding the per-entry lists, so the client
encodes one value per call instead of one per entry. redis-py's Script objects run EVALSHA
and reload on NOSCRIPT (e.g. after a server restart).

Preludes (Lua has no includes): ``fields`` (the wire field names, generated from codec.py)
goes before every script, ``lib`` (time, ownership, chunked XACK) before the worker scripts.
Where the server understands script flags (Redis 7+, Valkey), each worker script starts
with a ``#!lua`` line: scripts that add data are refused *whole* while Redis is out of
memory, before they write anything (so staged writes, done records and acks land together
or not at all), and the scripts that only extend, acknowledge or delete (heartbeat, ack,
adopt, trim, reap) carry ``allow-oom`` so live jobs stay alive and acks still free memory.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import msgpack
import redis.exceptions

from streamwork._redis.faults import denial
from streamwork._wire.codec import ATTEMPTS_FIELD, BODY_FIELD
from streamwork._wire.keys import GroupKeys, StreamKeys
from streamwork._wire.priorities import sibling_streams

#: scripts registered from another script's file (with other flags)
_FILES: Final = {"ack": "complete"}
_WORKER: Final = ("ack", "adopt", "cancel", "claim", "complete", "fail", "heartbeat",
                  "promote", "read", "reclaim", "schedule", "start", "tick")
#: shared Lua prepended to each script, in order
PRELUDES: Final = {name: ("fields", "lib") for name in _WORKER} | {
    # the scripts that end jobs report a join child's end (join_lib.lua's end_report)
    name: ("fields", "lib", "join_lib") for name in ("ack", "claim", "complete", "fail",
                                                     "join")}
#: script flags on servers that have them; scripts not named here get no ``#!lua`` line
FLAGS: Final = {
    "cancel": "", "claim": "", "complete": "", "fail": "", "produce": "", "promote": "",
    "send": "",
    "rate": "", "reclaim": "", "semaphore": "allow-oom",
    "read": "allow-oom",  # reads (and creates a level's group): never refused under OOM
    "ack": "allow-oom", "adopt": "allow-oom", "heartbeat": "allow-oom", "reap": "allow-oom",
    "start": "allow-oom",  # rewrites a job's existing record (held -> running) in place
    "trim": "allow-oom",
    "tick": "",  # periodic jobs: adds jobs, so refused whole under OOM
    "chain": "",  # moves chained jobs onto their targets: refused whole under OOM
    "join": "",  # opens joins, records their children's ends: may enqueue a callback
}
#: a script that compiles only where the server understands flags
_PROBE: Final = "#!lua flags=no-writes\nreturn 1"

Arg = str | bytes | int | float


def file_of(name: str) -> str:
    """The name of the ``lua/`` file script ``name`` is made of (``ack`` is ``complete``
    with other flags)."""
    return _FILES.get(name, name)


def lua_text(name: str) -> str:
    """The text of ``lua/<name>.lua`` (``fields``: the wire field names), no preludes."""
    return _read(name)


def _read(name: str) -> str:
    if name == "fields":  # the wire field names, from the one place that defines them
        return (f"local BODY, ATTEMPTS = '{BODY_FIELD.decode()}', "
                f"'{ATTEMPTS_FIELD.decode()}'\n")
    lua = resources.files("streamwork._redis") / "lua"
    return (lua / f"{name}.lua").read_text(encoding="utf-8")


@functools.cache
def source(name: str, flags: bool = False) -> str:
    """Text of script ``name``: its ``#!lua`` line (with ``flags``), then the preludes it
    uses, then ``lua/<file>.lua``."""
    header = ""
    if flags and name in FLAGS:
        header = "#!lua" + (f" flags={FLAGS[name]}" if FLAGS[name] else "") + "\n"
    preludes = PRELUDES.get(name, ("fields",))
    return header + "".join(_read(p) for p in preludes) + _read(_FILES.get(name, name))


def pack(value: Any) -> bytes:
    """MessagePack for Redis's Lua cmsgpack, which reads str but not bin: bytes go as str."""
    data: bytes = msgpack.packb(value, use_bin_type=False)
    return data


@dataclass(frozen=True, slots=True)
class Call:
    """One script invocation: which script, its KEYS and its ARGV."""

    script: str
    keys: Sequence[Arg]
    args: Sequence[Arg]


# ---- the scripts' calling conventions (pure: each builds the KEYS and ARGV of one script)


def produce(keys: StreamKeys, bodies: Sequence[bytes], maxlen: int | None = None,
            marker: str | None = None, marker_ttl_ms: int = 0) -> Call:
    """produce.lua: XADD ``bodies`` to the stream in one atomic step (trimming to about
    ``maxlen`` entries when given); returns their ids. With ``marker`` (a key of
    ``keys``, kept ``marker_ttl_ms``) the call is idempotent: repeated while the marker
    lives, it adds nothing and returns the first call's ids."""
    if marker is None:
        return Call("produce", [keys.stream], [pack(list(bodies)), maxlen or ""])
    return Call("produce", [keys.stream, marker],
                [pack(list(bodies)), maxlen or "", marker_ttl_ms])


def send(keys: StreamKeys, body: bytes, maxlen: int | None, marker: str,
         marker_ttl_ms: int) -> Call:
    """send.lua: XADD one job (trimming to about ``maxlen`` entries when given) unless the
    call's ``marker`` says it was added (kept ``marker_ttl_ms``); returns its id."""
    return Call("send", [keys.stream, marker], [body, maxlen or "", marker_ttl_ms])


def rate(bucket: str, per_ms: float, burst: float) -> Call:
    """rate.lua: take a token from the group's bucket; 0, or ms until one is due."""
    return Call("rate", [bucket], [repr(per_ms), repr(burst)])


def semaphore(key: str, mode: str, holder: str, limit: int, ttl_ms: int) -> Call:
    """semaphore.lua: "take", "keep" or "give" a hold of one concurrency key."""
    return Call("semaphore", [key], [mode, holder, limit, ttl_ms])


def cancel(record: str, settings: str, reason: str, ttl_ms: int) -> Call:
    """cancel.lua: mark job record ``record`` cancelled (or, running, cancel-requested);
    ``settings`` is its group's settings hash; returns the state the job was in."""
    return Call("cancel", [record, settings], [reason, ttl_ms])


def _group_keys(g: GroupKeys) -> list[Arg]:
    """KEYS[1..3] of the scripts that work on a group's deliveries (their last two KEYS
    are the stream's high and low priority levels: delivery sources 2 and 3)."""
    return [g.stream.stream, g.retry, g.retries]


def claim(g: GroupKeys, consumer: str, ttl_ms: int, owner: str, mode: str,
          batch: list[list[Any]], report_keys: Sequence[str | bytes] = ()) -> Call:
    """claim.lua: take (``mode`` "lease"), check ("check") or mark ("mark") job records;
    ``batch`` is [[entry id...], [src...], [job key...], [attempt...], [lease...]], and in
    "lease" mode optionally [start (1: taken as running at once)...], then optionally [end
    report...] (their keys ``report_keys``)."""
    return Call("claim",
                [g.stream.stream, g.retry, g.stream.fence, *report_keys,
                 *sibling_streams(g.stream)],
                [g.name, consumer, ttl_ms, owner, g.job_prefix, mode, pack(batch)])


def start(g: GroupKeys, consumer: str, mode: int, ttl_ms: int,
          batch: list[list[Any]]) -> Call:
    """start.lua: turn held leases into running ones as handlers start (op "s"), or back
    into held ones waiting for an in-place retry (op "h"); ``batch`` is [[id...], [src...],
    [job key...], [lease...], [member...], [op...], [attempt...], [due ms...]]."""
    return Call("start", [*_group_keys(g), *sibling_streams(g.stream)],
                [g.name, consumer, g.job_prefix, int(mode), ttl_ms, pack(batch)])


def complete(g: GroupKeys, consumer: str, mode: int, done_ttl_ms: int, staged: bytes,
             staged_keys: Sequence[str | bytes], batch: list[list[Any]],
             *, oom_ok: bool = False, lease_ttl_ms: int = 30_000) -> Call:
    """complete.lua (``oom_ok``: its ``ack`` twin, allowed under OOM): record successes;
    ``batch`` is [[id...], [src...], [job key...], [lease...], [member...], [done...]];
    ``lease_ttl_ms`` is what a record found leased by another gets back as its TTL."""
    return Call("ack" if oom_ok else "complete",
                [*_group_keys(g), *staged_keys, *sibling_streams(g.stream)],
                [g.name, consumer, int(mode), done_ttl_ms, staged, g.job_prefix, pack(batch),
                 lease_ttl_ms])


def fail(g: GroupKeys, consumer: str, worker: str, mode: int, dead_ttl_ms: int,
         entries: list[list[Any]], report_keys: Sequence[str | bytes] = ()) -> Call:
    """fail.lua: schedule retries (this group only) or dead-letter, one list per entry;
    ``report_keys``: the keys the entries' end reports write (KEYS[5..])."""
    return Call("fail", [*_group_keys(g), g.stream.dead, *report_keys,
                         *sibling_streams(g.stream)],
                [g.name, consumer, worker, g.job_prefix, int(mode), dead_ttl_ms,
                 pack(entries)])


def heartbeat(g: GroupKeys, consumer: str, ttl_ms: int, batch: list[list[Any]]) -> Call:
    """heartbeat.lua: reset idle times and extend leases of held deliveries;
    ``batch`` is [[id...], [src...], [job key...], [lease...], [member...], [Redlock
    mark...], [progress...]]."""
    return Call("heartbeat", [*_group_keys(g), *sibling_streams(g.stream)],
                [g.name, consumer, ttl_ms, g.job_prefix, pack(batch), g.progress_prefix])


def adopt(g: GroupKeys, consumer: str, ttl_ms: int, batch: list[list[Any]]) -> Call:
    """adopt.lua: take over deliveries whose entry was deleted while held;
    ``batch`` is [[id...], [src...], [member...]]."""
    return Call("adopt", [*_group_keys(g), *sibling_streams(g.stream)],
                [g.name, consumer, ttl_ms, pack(batch)])


def read(streams: Sequence[str], group: str, consumer: str, room: int, order: str,
         weights: Sequence[int]) -> Call:
    """read.lua: one read round over a stream's priority levels (``streams`` in the order
    they are served, each with its weight; 0: served first), ``room`` entries at most."""
    return Call("read", list(streams), [group, consumer, room, order, *weights])


def reclaim(stream: str, dead: str, group: str, consumer: str, min_idle_ms: int,
            cursor: Arg, count: int, worker: str, ids: Sequence[Arg] = ()) -> Call:
    """reclaim.lua on one stream (the stream itself or a group's retry stream): from
    ``cursor`` on, up to ``count``; or exactly the entries ``ids`` when given."""
    return Call("reclaim", [stream, dead],
                [group, consumer, min_idle_ms, cursor, count, worker, *ids])


def promote(pairs: list[tuple[str, str]], count: int) -> Call:
    """promote.lua: move due members of each ZSET (delayed sends, or a group's retries) onto
    its stream (the stream itself, or that group's retry stream), up to ``count`` a pair;
    the reply is (moved, ms until the next is due or -1) per pair, flattened."""
    return Call("promote", [key for pair in pairs for key in pair], [count])


def trim(stream: str, cutoff_ms: int, limit: int, shared_with: str | None = None) -> Call:
    """trim.lua: drop entries every group acknowledged, older than the cutoff, at most
    ``limit`` a call; the reply is (entries trimmed, 1 if more may be left else 0). With
    ``shared_with`` (the stream whose every group reads ``stream`` too), nothing while one
    of that stream's groups has not joined ``stream``."""
    return Call("trim", [stream] if shared_with is None else [stream, shared_with],
                [cutoff_ms, limit])


def reap(stream: str, group: str, idle_ms: int, keep: str) -> Call:
    """reap.lua: remove idle consumers that own nothing (never ``keep``)."""
    return Call("reap", [stream], [group, idle_ms, keep])


def tick(stream: str, last_tick: str, upto_ms: int,
         ticks: Sequence[tuple[int, bytes]]) -> Call:
    """tick.lua: XADD a schedule's due ticks (``(tick ms, body)``, ascending) onto
    ``stream`` unless another worker decided them already; ``upto_ms`` is the latest tick
    this call decides about (later than any it enqueues if catch_up skipped some)."""
    return Call("tick", [stream, last_tick], [str(upto_ms), pack([list(t) for t in ticks])])


def schedule(k: StreamKeys, delay_ms: str, at_ms: str, members: Sequence[bytes],
             marker: str | None = None, marker_ttl_ms: int = 0) -> Call:
    """schedule.lua: add members to the delayed ZSET, due after a delay or at a time;
    idempotent with ``marker`` as `produce` is."""
    if marker is None:
        return Call("schedule", [k.delayed], [delay_ms, at_ms, pack(list(members))])
    return Call("schedule", [k.delayed, marker],
                [delay_ms, at_ms, pack(list(members)), marker_ttl_ms])


def chain(target: StreamKeys, source: str, entries: list[list[Any]]) -> Call:
    """chain.lua: move outbox entries of stream ``source`` onto ``target`` unless moved
    before; ``entries`` is [[outbox entry id, body, maxlen or "", due ms or ""], ...] in id
    order. Returns [added, skipped]."""
    return Call("chain", [target.chained(source), target.stream, target.delayed],
                [pack(entries)])


def join_open(k: StreamKeys, key: str, n: int, policy: str, to: str, body: bytes,
              ttl_ms: int) -> Call:
    """join.lua "open": join ``key`` of callback stream ``k`` waits for ``n`` children,
    then sends ``body`` to ``to`` (the stream or its level stream); 1 opened, 2 opened and
    fired, 0 open already."""
    return Call("join", [k.join(key), k.join_results(key), k.dead],
                ["open", n, policy, to, body, ttl_ms])


def join_report(k: StreamKeys, key: str, reports: list[list[Any]], ttl_ms: int) -> Call:
    """join.lua "report": children's ends, [[child index, state, value], ...], drained
    from an outbox; how many were new."""
    return Call("join", [k.join(key), k.join_results(key), k.dead],
                ["report", pack(reports), ttl_ms])


def replay(k: StreamKeys, group: str, ids: Sequence[str]) -> Call:
    """replay.lua: hand dead letters back to their groups (only ``group``'s if given)."""
    return Call("replay", [k.stream, k.dead], [k.retry_prefix, group, pack(list(ids))])


def redlock_acquire(key: str, fence: str, value: str, ttl_ms: int) -> Call:
    """redlock_acquire.lua on one master: SET NX PX, and report the fencing counter."""
    return Call("redlock_acquire", [key, fence], [value, ttl_ms])


def redlock_fence(fence: str, proposal: int) -> Call:
    """redlock_fence.lua on one master: set the counter if the proposal is greater."""
    return Call("redlock_fence", [fence], [proposal])


def redlock_extend(key: str, value: str, ttl_ms: int) -> Call:
    """redlock_extend.lua on one master: compare-and-PEXPIRE."""
    return Call("redlock_extend", [key], [value, ttl_ms])


def redlock_release(key: str, value: str) -> Call:
    """redlock_release.lua on one master: compare-and-delete."""
    return Call("redlock_release", [key], [value])


def fenced_set(key: str, token: int, value: Arg) -> Call:
    """redlock_fenced_set.lua: store a value unless a newer fencing token was seen."""
    return Call("redlock_fenced_set", [key], [token, value])


# ---- running them


#: attributes a refused script call's exception carries (``streamwork._redis.acl`` reads
#: them to name the script and its keys in the message): the script's name, its KEYS
NOTED_SCRIPT: Final = "streamwork_script"
NOTED_KEYS: Final = "streamwork_keys"


def _note(exc: BaseException, call: Call) -> None:
    """Remember on ``exc`` which script it came from, and with which KEYS."""
    if getattr(exc, NOTED_SCRIPT, None) is None:
        try:
            setattr(exc, NOTED_SCRIPT, call.script)
            setattr(exc, NOTED_KEYS, tuple(call.keys))
        except AttributeError:  # an exception type without a __dict__: nothing noted
            pass


class _Registry:
    """Script objects of one client (EVALSHA, reloaded on NOSCRIPT)."""

    def __init__(self, client: Any, flags: bool = False) -> None:
        self._client = client
        self._flags = flags
        self._scripts: dict[str, Any] = {}

    def use_flags(self, flags: bool) -> None:
        """Register the scripts with (or without) ``#!lua`` flags from now on."""
        if flags != self._flags:
            self._flags = flags
            self._scripts.clear()

    def _script(self, name: str) -> Any:
        script = self._scripts.get(name)
        if script is None:
            script = self._client.register_script(source(name, self._flags))
            self._scripts[name] = script
        return script


class AsyncScripts(_Registry):
    """The scripts on an asyncio client; ``flags``: the server understands script flags."""

    async def run(self, call: Call, client: Any = None) -> Any:
        """Run ``call`` (on ``client`` instead of the registered one, if given)."""
        try:
            return await self._script(call.script)(keys=call.keys, args=call.args,
                                                   client=client)
        except redis.exceptions.ResponseError as exc:
            _note(exc, call)
            raise


class SyncScripts(_Registry):
    """The scripts on a sync client."""

    def run(self, call: Call, client: Any = None) -> Any:
        """Run ``call`` (on ``client`` instead of the registered one, if given)."""
        try:
            return self._script(call.script)(keys=call.keys, args=call.args, client=client)
        except redis.exceptions.ResponseError as exc:
            _note(exc, call)
            raise


async def supports_flags(client: Any) -> bool:
    """Whether the server behind an asyncio ``client`` understands ``#!lua`` flags."""
    try:
        await client.eval(_PROBE, 0)
    except redis.exceptions.ResponseError as exc:
        if denial(exc) is not None:  # the user may not EVAL: say so, it is no answer
            raise
        return False
    return True
