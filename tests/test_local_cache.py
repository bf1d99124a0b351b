"""The local done-cache forgets keys after their TTL and beyond its size (pure, no Redis)."""

from __future__ import annotations

from streamwork._worker.core.done_cache import RecentKeys


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_keys_expire_after_ttl() -> None:
    """A key is known for ttl seconds, then forgotten."""
    clock = _Clock()
    cache = RecentKeys(10, 5.0, clock)
    cache.add("a")
    assert "a" in cache
    clock.now += 4.9
    assert "a" in cache
    clock.now += 0.2
    assert "a" not in cache
    cache.add("b")
    assert len(cache) == 1


def test_size_is_bounded_oldest_first() -> None:
    """Past maxsize the oldest keys go first."""
    cache = RecentKeys(3, 60.0, _Clock())
    for k in "abcde":
        cache.add(k)
    assert len(cache) == 3
    assert [k for k in "abcde" if k in cache] == ["c", "d", "e"]


def test_re_adding_a_key_refreshes_it() -> None:
    """Adding a key again extends its life; its old slot does not evict it."""
    clock = _Clock()
    cache = RecentKeys(10, 5.0, clock)
    cache.add("a")
    clock.now += 3
    cache.add("a")
    clock.now += 3
    cache.add("b")
    assert "a" in cache
