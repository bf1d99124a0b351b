"""The streams one consumer reads deliveries from, by source number: the stream itself
(``MAIN``), the group's retry stream (``RETRY``) and up to two more that a feature adds
(sources 2 and 3, the last two KEYS of every worker script). A source a feature added
is read once it is joined (the group exists on it); the reclaimer, the trim and the
heartbeat go over the joined ones, highest rank first. Such a source is shared by every
group of the stream (each joins it when it first looks), so it is trimmed only once all of
the stream's groups have joined it."""

from __future__ import annotations

from streamwork._worker.core.delivery import EXTRA_SOURCES, MAIN, RETRY


class Sources:
    """One consumer's sources: each one's stream name and rank (lower first), and which
    ones the group has joined."""

    __slots__ = ("_by_name", "joined", "names", "rank")

    def __init__(self, stream: str, retry: str) -> None:
        self.names: dict[int, str] = {MAIN: stream, RETRY: retry}
        self.rank: dict[int, int] = {MAIN: 0, RETRY: 1}
        self.joined: set[int] = {MAIN, RETRY}
        self._by_name = {stream.encode(): MAIN, retry.encode(): RETRY}

    def add(self, src: int, stream: str, rank: int) -> None:
        """A feature's source ``src`` (2 or 3) on ``stream``, not joined yet."""
        if src not in EXTRA_SOURCES:
            raise ValueError(f"a feature's source is one of {EXTRA_SOURCES}, not {src}")
        self.names[src] = stream
        self.rank[src] = rank
        self._by_name[stream.encode()] = src

    def join(self, src: int) -> None:
        self.joined.add(src)

    def forget(self) -> None:
        """The group was created again (Redis came back empty): only the stream and the
        retry stream are known to have it."""
        self.joined.intersection_update((MAIN, RETRY))

    @property
    def extra(self) -> bool:
        """Whether a feature's source is joined (reads then go over several streams)."""
        return len(self.joined) > 2

    def src_of(self, stream: bytes) -> int:
        """The source of entries read from ``stream`` (by its name as Redis sends it)."""
        return self._by_name.get(stream, RETRY)

    def read_now(self) -> list[tuple[int, str]]:
        """The joined sources, highest rank first: (src, stream)."""
        return [(src, self.names[src])
                for src in sorted(self.joined, key=self.rank.__getitem__)]

    def added(self) -> list[str]:
        """The streams of the sources features added, in source order (2, then 3)."""
        return [self.names[src] for src in EXTRA_SOURCES if src in self.names]

    def every(self) -> list[tuple[int, str]]:
        """Every source, joined or not, highest rank first (the gauges count them all)."""
        return [(src, self.names[src]) for src in sorted(self.names, key=self.rank.__getitem__)]
