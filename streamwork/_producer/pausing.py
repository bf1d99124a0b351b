"""Pausing and resuming a consumer group, without I/O: `pause`, `resume` and `paused` as
steps (see `rounds`), written once for both shells, which inherit them.

The pause is one hash per group (``GroupKeys.paused``) in the stream's slot; on a
partitioned stream, one in each partition, since each partition's consumers read their
own. The group's workers read it once a second (`streamwork._worker.features.pause`).
"""

from __future__ import annotations

import time

from streamwork._producer.core import keys_of
from streamwork._producer.jobs import Jobs
from streamwork._producer.rounds import Delete, HashGetAll, HashSet, Steps
from streamwork._wire.pausing import PauseState, parse_pause, pause_fields


class Pausing(Jobs):
    """The steps of `pause`, `resume` and `paused`, on top of the job steps."""

    def _pause_steps(self, stream: str, group: str, reason: str | None) -> Steps[PauseState]:
        """`pause`: one HSET per partition, after checking the group (a typo must not
        pause nothing)."""
        now_ms = int(time.time() * 1000)
        fields = pause_fields(reason, now_ms)
        keys = self._pause_keys(stream, group)
        yield from self._check_group(stream, group)
        for key in keys:
            yield from self._io(f"pause {group!r} of {stream!r}", HashSet(key, fields))
        return PauseState(str(fields["reason"]), now_ms / 1000)

    def _resume_steps(self, stream: str, group: str) -> Steps[bool]:
        """`resume`: one DEL per partition; whether any of them was paused."""
        keys = self._pause_keys(stream, group)
        yield from self._check_group(stream, group)
        was = 0
        for key in keys:
            was += int((yield from self._io(f"resume {group!r} of {stream!r}", Delete(key))))
        return was > 0

    def _paused_steps(self, stream: str, group: str) -> Steps[PauseState | None]:
        """`paused`: one HGETALL per partition until a pause is found."""
        keys = self._pause_keys(stream, group)
        for key in keys:
            state = parse_pause((yield from self._io(
                f"read the pause of {group!r} of {stream!r}", HashGetAll(key))))
            if state is not None:
                return state
        yield from self._check_group(stream, group)
        return None

    def _pause_keys(self, stream: str, group: str) -> list[str]:
        """The pause hash of ``group`` in every partition of ``stream`` (names checked)."""
        keys_of(stream).group(group)
        return [keys_of(name).group(group).paused for name in self._streams(stream)]
