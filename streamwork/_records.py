"""Job records: one Redis string per (stream, group, job key), readable by anyone.

The first byte is the state, the rest its details:

* ``R<owner>:<token>|<attempt>|<since ms>`` - running: this string IS the lease (PX = the
  lease TTL, extended by heartbeats); written by claim.lua.
* ``D`` + MessagePack ``[token, attempts, updated ms, result, note]`` - done: the
  done-marker (PX = ``dedup_window``) holding ``handle()``'s return value (``note`` says why
  a result was not kept); written by complete.lua from what `done_record` builds.
* ``W`` + MessagePack ``[attempts, updated ms, due ms, error]`` - waiting for a retry;
* ``X`` + MessagePack ``[attempts, updated ms, dead-letter id, reason, error]`` - dead;
  both written by fail.lua and neither blocks a later copy of the key from running;
* ``C`` + MessagePack ``[updated ms, reason]`` - cancelled (cancel.lua, or fail.lua for a
  job cancelled while it ran): its deliveries are acknowledged without running. A running
  job that is cancelled keeps its ``R`` lease with ``|C`` appended until it ends.

No record: this group has not started the job, or its record expired (``unknown``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from ._usercode import describe

DEFAULT_MAX_RESULT_BYTES: Final = 64 * 1024  #: results larger than this are not kept
_NIL: Final = b"\xc0"  #: MessagePack's nil
_ARRAY_OF_5: Final = b"\x95"  #: MessagePack's header of an array of 5 items

STATES: Final = {"R": "running", "D": "done", "W": "waiting", "X": "dead", "C": "cancelled"}


@dataclass(frozen=True, slots=True)
class JobStatus:
    """What a group knows of one job key (`Producer.status`).

    ``state``: "running" | "waiting" (a retry is due at ``due``) | "done" | "dead" |
    "cancelled" | "unknown" (not started by this group, or its record expired); a running
    job whose cancellation was asked has ``reason`` "cancel requested". ``result`` is
    ``handle()``'s return value once done (None if it returned nothing or the result was not
    kept: ``result_note`` says why); ``error`` the last failure, ``reason`` why a dead job
    died (``max_deliveries``, ``timeout``, a ``DeadLetter`` reason, ...) and
    ``dead_letter_id`` its entry in ``{S}:dead``; times are Unix seconds.
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

    @property
    def finished(self) -> bool:
        """Done or dead: nothing more will happen to it unless it is sent or replayed."""
        return self.state in ("done", "dead", "cancelled")


def done_record(token: int | None, attempts: int, result: Any, max_bytes: int,
                pack: Callable[[Any], bytes] | None = None) -> bytes:
    """The done record of a job whose handler returned ``result`` (capped at ``max_bytes``
    of MessagePack; over it, or not encodable, the job still completes without it).
    ``pack``: a reused ``msgpack.Packer(use_bin_type=True).pack`` (one thread only), which
    saves building a Packer per job."""
    if pack is None:
        pack = msgpack.Packer(use_bin_type=True).pack
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
    return b"".join((b"D", _ARRAY_OF_5, pack(token or 0), pack(attempts),
                     pack(int(time.time() * 1000)), packed, pack(note)))


def parse(stream: str, group: str, key: str, raw: bytes | None) -> JobStatus:
    """The status a job record says (None: unknown)."""
    if not raw:
        return JobStatus(stream, group, key, "unknown")
    state, rest = raw[:1].decode("latin-1"), raw[1:]
    if state == "R":
        text = rest.decode("utf-8", "replace")
        asked = text.endswith("|C")  # cancelled while it runs (cancel.lua)
        lease, attempt, since = (text[:-2] if asked else text).rsplit("|", 2)
        token = lease.rsplit(":", 1)[-1]
        return JobStatus(stream, group, key, "running", attempts=int(attempt),
                         updated_at=int(since) / 1000,
                         reason="cancel requested" if asked else "",
                         fencing_token=int(token) if token.isdigit() else None)
    fields = msgpack.unpackb(rest, raw=False, strict_map_key=False, unicode_errors="replace")
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
    if state == "X":
        attempts, updated, dead_id, reason, error = fields
        return JobStatus(stream, group, key, "dead", attempts=int(attempts), error=error,
                         reason=reason,
                         updated_at=updated / 1000, dead_letter_id=dead_id)
    raise ValueError(f"job record of {key!r} in group {group!r} has an unknown state {state!r}")
