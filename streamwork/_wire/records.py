"""Job records: one Redis string per (stream, group, job key), readable by anyone.

The first byte is the state, the rest its details:

* ``H<owner>:<token>|<attempt>|<since ms>`` - held: a worker has read the job and holds its
  lease (PX = the lease TTL, extended by heartbeats), its handler has not started; written
  by claim.lua. ``|W<due ms>`` appended: waiting for an in-place retry (ordered mode).
* ``R<owner>:<token>|<attempt>|<since ms>`` - running: the same lease once the start is
  committed (start.lua turns H into R in the step that checks for a cancel; claim.lua
  writes R at once for a job whose handler is called at once). A cancel asked
  while it runs appends ``|C<lease deadline ms>|<cancel ttl ms>|<reason>`` and keeps the
  record for the cancel's ttl; past the deadline its worker is gone and the job counts as
  cancelled (whoever reclaims it acknowledges it without running it).
* ``D`` + MessagePack ``[token, attempts, updated ms, result, note]`` - done: the
  done-marker (PX = ``dedup_window``) holding ``handle()``'s return value (``note`` says why
  a result was not kept); written by complete.lua from what `done_record` builds.
* ``W`` + MessagePack ``[attempts, updated ms, due ms, error]`` - waiting for a retry;
* ``X`` + MessagePack ``[attempts, updated ms, dead-letter id, reason, error]`` - dead;
  both written by fail.lua and neither blocks a later copy of the key from running;
* ``C`` + MessagePack ``[updated ms, reason]`` - cancelled (cancel.lua, or the scripts that
  end a job cancelled): its deliveries are acknowledged without running.
* ``E`` + MessagePack ``[attempts, updated ms, state, reason]`` - ended without running, as
  a worker feature decided (``state`` says how, e.g. ``expired``; fail.lua); it does not
  block a later copy of the key from running.

No record: this group has not started the job, or its record expired (``unknown``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from streamwork._text import describe
from streamwork._wire.extensions import BadExt, Codec, ext_hook, packer
from streamwork.errors import DecodeError

DEFAULT_MAX_RESULT_BYTES: Final = 64 * 1024  #: results larger than this are not kept
RECORD_ERROR_LIMIT: Final = 400  #: characters of a failure a job record keeps (`record_error`)
CUT: Final = "…"  #: marks where a record's error was cut
_NIL: Final = b"\xc0"  #: MessagePack's nil
_ARRAY_OF_5: Final = b"\x95"  #: MessagePack's header of an array of 5 items
_EMPTY: Final = b"\xa0"  #: MessagePack's empty str

#: the states of a job that has not finished (every other state is final)
_LIVE: Final = frozenset({"unknown", "queued", "running", "waiting"})
STATES: Final = {"H": "queued", "R": "running", "D": "done", "W": "waiting", "X": "dead",
                  "C": "cancelled"}


#: what `Producer.cancel` answers (the state the job was in) and what the cancel did then
CANCEL_EFFECTS: Final = {
    "unknown": "not read by the group yet (or never sent): it will not run",
    "queued": "read ahead by a worker, not started: it will not run",
    "waiting": "waiting for a retry: it will not run again",
    "dead": "dead: a replay of it will not run",
    "running": "running: its handler sees msg.cancelled at the next heartbeat, and the job "
               "ends cancelled whatever the handler does next (no retry, staged writes "
               "dropped), even if its worker dies",
    "done": "already done: nothing changed",
    "cancelled": "already cancelled: nothing changed",
    "ignored": "the group's workers keep no job records (dedup off): a cancel cannot stop "
               "it, nothing changed",
}


@dataclass(frozen=True, slots=True)
class JobStatus:
    """What a group knows of one job key (`Producer.status`).

    ``state``: "queued" (a worker has read it and holds it, its start not committed) |
    "running" (a worker has committed to run it: its handler has started, or starts at
    once) | "waiting" (a retry is due at ``due``) | "done" |
    "dead" | "cancelled" | a state a worker feature ended it in without running it
    ("expired": not started before its ``expires``) | "unknown" (not read by this group
    yet, or its record expired: a job still in the stream, or delayed, says "unknown");
    ``reason`` says why it ended so; a running job whose cancellation
    was asked has ``reason`` "cancel requested: <reason>" (it will end cancelled).
    ``result`` is ``handle()``'s return value once done (None if it returned nothing or
    the result was not kept: ``result_note`` says why); ``error`` the last failure,
    ``reason`` why a dead job died (``max_deliveries``, ``timeout``, a ``DeadLetter``
    reason, ...) or why it was cancelled, and ``dead_letter_id`` its entry in ``{S}:dead``;
    times are Unix seconds.
    """

    stream: str
    group: str
    key: str
    state: str
    attempts: int = 0
    result: Any = None
    result_note: str = ""
    error: str = ""
    reason: str = ""
    updated_at: float | None = None
    due: float | None = None
    dead_letter_id: str | None = None
    fencing_token: int | None = None
    #: how far its handler got (``msg.progress``): 0.0 to 1.0, None if never reported or
    #: the report lapsed (kept a visibility timeout past its worker's last heartbeat)
    progress: float | None = None
    progress_note: str = ""
    progress_at: float | None = None  #: when it was reported (Unix seconds)

    @property
    def finished(self) -> bool:
        """Done, dead, cancelled or ended without running (expired, ...): nothing more will
        happen to it unless it is sent or replayed."""
        return self.state not in _LIVE


def done_record(token: int | None, attempts: int, result: Any, max_bytes: int,
                pack: Callable[[Any], bytes] | None = None, now: bytes | None = None) -> bytes:
    """The done record of a job whose handler returned ``result`` (capped at ``max_bytes``
    of MessagePack; over it, or not encodable, the job still completes without it).
    ``pack``: a reused ``_extensions.packer(codec).pack`` (one thread only), which saves
    building a Packer per job and carries the worker's ext types; ``now``: the packed
    finish time (Unix ms) of a batch, read once for all of its jobs (else read here)."""
    if pack is None:
        pack = packer().pack
    note = ""
    packed = _NIL
    if result is not None:
        try:
            packed = pack(result)
        except Exception as exc:  # not encodable, or the user's type raised when asked
            note = f"result not kept: not MessagePack-able ({describe(exc)})"
            packed = _NIL
        else:
            if len(packed) > max_bytes:
                note = (f"result not kept: {len(packed)} bytes of MessagePack, over "
                        f"max_result_bytes={max_bytes}")
                packed = _NIL
    # the record's array is put together here, so the result is packed once: a value
    # whose packing succeeds once need not succeed twice
    if now is None:
        now = pack(int(time.time() * 1000))
    return b"".join((b"D", _ARRAY_OF_5, pack(token or 0), pack(attempts), now, packed,
                     pack(note) if note else _EMPTY))


def record_error(error_type: str, detail: str, limit: int = RECORD_ERROR_LIMIT) -> str:
    """The error a waiting or dead job's record keeps: ``<type>: <detail>`` whole when it
    fits in ``limit`` characters; else its first line (the error, itself capped) and the
    last whole lines of the traceback that fit (where it was raised, ending with the
    error), with a line saying how many lines were cut: a traceback line is kept whole or
    left out, never cut mid-word as a plain character cap would."""
    text = f"{error_type}: {detail}" if detail else error_type
    if len(text) <= limit:
        return text
    lines = text.split("\n")
    head = lines[0]
    if len(head) > limit // 2:
        head = f"{head[:limit // 2]}{CUT} ({len(head) - limit // 2} more characters)"
    rest = lines[1:]
    room = limit - len(head) - len(_cut_line(len(rest))) - 2
    tail: list[str] = []
    for line in reversed(rest):
        if len(line) + 1 > room:
            break
        tail.insert(0, line)
        room -= len(line) + 1
    cut = len(rest) - len(tail)
    return "\n".join([head] + ([_cut_line(cut)] if cut else []) + tail)


def _cut_line(lines: int) -> str:
    return f"{CUT} ({lines} line{'s' if lines != 1 else ''} cut)"


def parse(stream: str, group: str, key: str, raw: bytes | None,
          codec: Codec | None = None, progress: bytes | None = None) -> JobStatus:
    """The status a job record says (None: unknown). A result's ext types are decoded by
    ``codec`` and the built-in hooks; one of a code neither knows stays a `msgpack.ExtType`
    (so a tool without the codec still shows the record), and one whose decoder fails
    raises DecodeError ``result:invalid``. ``progress``: the job's progress record, if
    read (`with_progress`)."""
    status = _parse(stream, group, key, raw, codec)
    return with_progress(status, progress) if progress else status


def with_progress(status: JobStatus, raw: bytes) -> JobStatus:
    """``status`` with the progress a progress record (MessagePack [fraction, note, Unix
    ms]) says; unchanged if it does not decode."""
    try:
        fraction, note, at = msgpack.unpackb(raw, raw=False, unicode_errors="replace")
        return dataclasses.replace(status, progress=float(fraction), progress_note=str(note),
                                   progress_at=int(at) / 1000)
    except (ValueError, TypeError, msgpack.UnpackException):
        return status


def _parse(stream: str, group: str, key: str, raw: bytes | None,
           codec: Codec | None = None) -> JobStatus:
    """`parse` without the progress."""
    if not raw:
        return JobStatus(stream, group, key, "unknown")
    state, rest = raw[:1].decode("latin-1"), raw[1:]
    if state in ("R", "H"):
        return _leased(stream, group, key, state, rest.decode("utf-8", "replace"))
    try:
        fields = msgpack.unpackb(rest, raw=False, strict_map_key=False,
                                 unicode_errors="replace", timestamp=3,
                                 ext_hook=ext_hook(codec, keep=True))
    except (BadExt, DecodeError, OverflowError) as exc:
        raise DecodeError("result:invalid", f"the result of job {key!r} (group {group!r}) "
                                            f"does not decode: {describe(exc)}") from exc
    if state == "D":
        token, attempts, updated, result, note = fields
        return JobStatus(stream, group, key, "done", attempts=int(attempts), result=result,
                         result_note=note, updated_at=updated / 1000,
                         fencing_token=int(token) or None)
    if state == "W":
        attempts, updated, due, error = fields
        return JobStatus(stream, group, key, "waiting", attempts=int(attempts), error=error,
                         updated_at=updated / 1000, due=due / 1000)
    if state == "C":
        updated, why = fields
        return JobStatus(stream, group, key, "cancelled", updated_at=updated / 1000,
                         reason=why)
    if state == "E":
        attempts, updated, ended, why = fields
        return JobStatus(stream, group, key, str(ended), attempts=int(attempts),
                         updated_at=updated / 1000, reason=why)
    if state == "X":
        attempts, updated, dead_id, reason, error = fields
        return JobStatus(stream, group, key, "dead", attempts=int(attempts), error=error,
                         reason=reason,
                         updated_at=updated / 1000, dead_letter_id=dead_id)
    raise ValueError(f"job record of {key!r} in group {group!r} has an unknown state {state!r}")


def _leased(stream: str, group: str, key: str, state: str, text: str) -> JobStatus:
    """The status of a held (H) or running (R) record: see the module's docstring."""
    parts = text.split("|", 5)
    lease, attempt, since = parts[0], int(parts[1]), int(parts[2]) / 1000
    token = lease.rsplit(":", 1)[-1]
    fencing = int(token) if token.isdigit() else None
    extra = parts[3] if len(parts) > 3 else ""
    if state == "H":
        if extra.startswith("W"):
            return JobStatus(stream, group, key, "waiting", attempts=attempt - 1,
                             updated_at=since, due=int(extra[1:]) / 1000,
                             reason="retry in place (ordered)", fencing_token=fencing)
        return JobStatus(stream, group, key, "queued", attempts=attempt - 1,
                         updated_at=since, reason="held by a worker", fencing_token=fencing)
    if extra.startswith("C") and len(parts) == 6:
        why = parts[5]
        if int(extra[1:]) <= time.time() * 1000:  # its worker died: it will not run again
            return JobStatus(stream, group, key, "cancelled", attempts=attempt,
                             updated_at=since, reason=why, fencing_token=fencing)
        return JobStatus(stream, group, key, "running", attempts=attempt, updated_at=since,
                         reason=f"cancel requested: {why}" if why else "cancel requested",
                         fencing_token=fencing)
    return JobStatus(stream, group, key, "running", attempts=attempt, updated_at=since,
                     fencing_token=fencing)
