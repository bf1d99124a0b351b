"""A sent job's fate, without I/O: `status`, `cancel` and `result` as steps (generators
yielding the round trips they need, see `rounds`), written once for both shells, which
inherit them."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

import redis

from streamwork._producer.core import Core, keys_of
from streamwork._producer.rounds import Groups, MGet, Script, Sleep, Steps
from streamwork._redis import scripts
from streamwork._redis.replies import CancelAnswer
from streamwork._wire import records
from streamwork._wire.job_options import check_order_key
from streamwork._wire.keys import check_utf8
from streamwork._wire.records import JobStatus
from streamwork.errors import ConfigError, GroupNotFound, JobFailed, StreamNotFound

CANCEL_TTL: Final = 7 * 86400.0  #: seconds a cancellation is kept by default


class Jobs(Core):
    """The steps of a sent job's status, cancel and result, on top of sending's `Core`."""

    def _status_steps(self, stream: str, key: str, group: str | None,
                      order_key: str | None) -> Steps[JobStatus]:
        """`status`: a GET of the job record in each partition it may be in, until one is
        found."""
        named = group
        if group is None:
            group = _only_group(stream, (yield from self._groups(stream)))
        gets = self._plan_status(stream, key, group, order_key)
        what = f"status of {key!r} in {stream!r}"
        raw = progress = None
        for get in gets:
            raw, progress = (yield from self._io(what, get)) or (None, None)
            if raw:
                break
        if not raw and named is not None:
            yield from self._check_group(stream, named)
        return records.parse(stream, group, key, raw, self.codec, progress)

    def _cancel_steps(self, stream: str, key: str, group: str | None, reason: str,
                      order_key: str | None, ttl: float) -> Steps[str]:
        """`cancel`: one cancel.lua call per partition the job may be in; the state that says
        most of the ones met."""
        named = group
        if group is None:
            group = _only_group(stream, (yield from self._groups(stream)))
        calls = self._plan_cancel(stream, key, group, reason, order_key, ttl)
        if named is not None:  # before writing: a typo must not record a cancellation
            yield from self._check_group(stream, named)
        what = f"cancel {key!r} in {stream!r}"
        states: list[str] = []
        for call in calls:
            states.append(_answer(_text((yield from self._io(what, Script(call))))))
        # a job lives in one partition; the others say "unknown"
        telling = (s for s in states if s != CancelAnswer.UNKNOWN.value)
        return next(telling, CancelAnswer.UNKNOWN.value)

    def _result_steps(self, stream: str, key: str, group: str | None, timeout: float | None,
                      order_key: str | None) -> Steps[Any]:
        """`result`: the job's status, again after a growing pause, until it is finished."""
        waits = _Waits(timeout)
        if group is None:
            group = yield from self._awaited_group(stream, waits)
        while True:
            st = yield from self._status_steps(stream, key, group, order_key)
            if st.state == "done":
                return st.result
            if st.finished:  # dead, cancelled, or ended unrun by a worker (expired, ...)
                raise JobFailed(st)
            yield Sleep(waits.next(functools.partial(_unfinished, st, waits.timeout)))

    def _awaited_group(self, stream: str, waits: _Waits) -> Steps[str]:
        """`result` without ``group=``: the stream's one consumer group, waited for while
        there is none (the job was sent before any worker started and created it)."""
        while True:
            try:
                groups = yield from self._groups(stream)
            except StreamNotFound:
                groups = []
            if groups:
                return _only_group(stream, groups)
            yield Sleep(waits.next(lambda: (
                f"stream {stream!r} got no consumer group within {waits.timeout} s: no "
                f"worker has started on it (is the stream name right?); start one, or pass "
                f"group=... to wait for a group that does not exist yet")))

    def _plan_status(self, stream: str, key: str, group: str,
                     order_key: str | None) -> list[MGet]:
        """The reads that may find job ``key``'s record (and its progress, in the same
        MGET): its partition's first (by its order key, which defaults to its key), then
        the other partitions'."""
        _check_key(key)
        if order_key is not None:
            check_order_key(order_key)
        names = self._streams(stream)
        home = self._target(stream, key, order_key)
        if order_key is not None:
            names = (home,)
        groups = [keys_of(name).group(group) for name in (home, *(n for n in names if n != home))]
        return [MGet((g.job(key), g.progress(key))) for g in groups]

    def _plan_cancel(self, stream: str, key: str, group: str, reason: str,
                     order_key: str | None, ttl: float) -> list[scripts.Call]:
        """One cancel.lua call per partition the job may be in: its own (by ``order_key``)
        when given or the stream is not partitioned, else every partition (a key sent
        with an order key of its own lives in that one's partition)."""
        _check_key(key)
        if order_key is not None:
            check_order_key(order_key)
        if not isinstance(reason, str):
            raise ConfigError("reason", f"must be a str, got {reason!r}")
        if (not isinstance(ttl, (int, float)) or isinstance(ttl, bool)
                or not math.isfinite(ttl) or ttl <= 0):
            raise ConfigError("ttl", f"must be a finite number of seconds > 0 (how long the "
                                     f"cancellation is kept), got {ttl!r}")
        names = self._streams(stream)
        if order_key is not None or len(names) == 1:
            names = (self._target(stream, key, order_key),)
        return [scripts.cancel(keys_of(name).group(group).job(key),
                               keys_of(name).group(group).settings, reason,
                               max(1, round(ttl * 1000)))
                for name in names]

    def _groups(self, stream: str) -> Steps[list[Any]]:
        """XINFO GROUPS of every partition of ``stream``, merged by group name;
        StreamNotFound when no partition exists."""
        keys_of(stream)
        names = self._streams(stream)
        what = f"list the groups of {stream!r}"
        if len(names) == 1:
            return (yield from self._groups_of(what, names[0]))
        replies: list[Any] = []
        for name in names:
            try:
                replies.append((yield from self._groups_of(what, name)))
            except StreamNotFound:
                replies.append(None)
        if all(r is None for r in replies):
            raise StreamNotFound(stream)
        seen: dict[Any, Any] = {}
        for reply in replies:
            for g in reply or ():
                seen.setdefault(g["name"], g)
        return list(seen.values())

    def _groups_of(self, what: str, stream: str) -> Steps[list[Any]]:
        """XINFO GROUPS of one stream; StreamNotFound when there is no such stream."""
        try:
            groups: list[Any] = yield from self._io(what, Groups(stream))
            return groups
        except redis.ResponseError as exc:
            if "no such key" in str(exc).lower():
                raise StreamNotFound(stream) from exc
            raise StreamNotFound(stream, f"is not a stream ({exc})") from exc

    def _check_group(self, stream: str, group: str) -> Steps[None]:
        """Raise GroupNotFound when ``stream`` has consumer groups but not ``group`` (a
        typo would otherwise read as "unknown" for ever). A stream with no group at all
        (no stream either) passes: its workers may not have started yet, and a job may be
        cancelled or waited for before they do. A group once found is not looked for again
        (a group is not expected to go away)."""
        if (stream, group) in self._groups_seen:
            return
        try:
            groups = yield from self._groups(stream)
        except StreamNotFound:
            groups = []
        names = _group_names(groups)
        if names and group not in names:
            raise GroupNotFound(stream, group, names)
        if group in names:
            if len(self._groups_seen) >= 10_000:
                self._groups_seen.clear()
            self._groups_seen.add((stream, group))


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ConfigError("key", f"must be a non-empty str (the job key given to send), "
                                 f"got {key!r}")
    return check_utf8("key", key)


def _text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _group_names(groups: Iterable[Any]) -> list[str]:
    """The names in an XINFO GROUPS reply, sorted."""
    return sorted(g["name"].decode() if isinstance(g["name"], bytes) else str(g["name"])
                  for g in groups)


def _only_group(stream: str, groups: Iterable[Any]) -> str:
    """The one consumer group of ``stream``; a status needs ``group=`` when there are more."""
    names = _group_names(groups)
    if len(names) == 1:
        return names[0]
    found = ", ".join(repr(n) for n in names) if names else "none"
    raise ConfigError("group", f"stream {stream!r} has {len(names)} consumer groups "
                               f"({found}): say which (group=... in Python, --group on the "
                               f"command line)")


def _unfinished(st: JobStatus, timeout: float | None) -> str:
    """What `result` says when job ``st`` did not finish in time."""
    return (f"job {st.key!r} of group {st.group!r} on {st.stream!r} did not finish within "
            f"{timeout} s (it is {st.state}); look with "
            f"`streamwork job {st.stream} {st.key} --group {st.group}`")


class _Waits:
    """The pauses of `result()`: 5 ms doubling up to 0.5 s (or to the retry's due time),
    never past the deadline, which raises TimeoutError."""

    def __init__(self, timeout: float | None) -> None:
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout
        self.pause = 0.005

    def next(self, late: Callable[[], str]) -> float:
        """The next pause; TimeoutError(``late()``) once the deadline has passed."""
        pause, self.pause = self.pause, min(self.pause * 2, 0.5)
        if self.deadline is None:
            return pause
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(late())
        return min(pause, left)


def _answer(text: str) -> str:
    """What cancel.lua answered: a `CancelAnswer`, or the state a job that a worker ended
    without running it was left in (its record's, e.g. "expired": nothing was changed)."""
    try:
        return CancelAnswer(text).value
    except ValueError:
        if not text or not text.isidentifier():
            raise ValueError(f"cancel.lua answered {text!r}, not a job state") from None
        return text
