"""A partitioned stream's figures added up, rates between samples and the reading of
replies, without Redis (samples built by hand)."""

from __future__ import annotations

from dataclasses import replace

from streamwork._ops.partitioned import merge_stats, partition_base
from streamwork._ops.rates import compute_rates, rates_between
from streamwork._ops.replies import entry_id, id_order, norm, opt_int, text
from streamwork._ops.stats import ConsumerStats, GroupStats, PartitionStats, StreamStats


def group(name: str, *, pending: int = 0, lag: int | None = 0, read: int | None = 0,
          last: str = "0-0", oldest: float | None = None, oldest_id: str | None = None,
          consumers: list[ConsumerStats] | None = None, waiting: int = 0,
          retry_lag: int | None = 0, due: int = 0) -> GroupStats:
    listed = consumers or []
    return GroupStats(name, len(listed), pending, oldest, lag, read, last,
                      [(c.name, c.pending) for c in listed], listed, oldest_id, waiting,
                      retry_lag, due)


def stream(name: str, *groups: GroupStats, length: int = 0, first: str | None = None,
           last: str = "0-0", delayed: int = 0, due: int = 0, dead: int = 0,
           added: int | None = 0, at_ms: int = 0) -> StreamStats:
    return StreamStats(name, length, first, last, list(groups), delayed, due, dead, added,
                       at_ms)


def test_counts_add_up_and_ids_span_the_partitions() -> None:
    a = stream("s#0.2", length=3, first="1700-0", last="1900-5", delayed=2, due=1, dead=1,
               added=10, at_ms=500)
    b = stream("s#1.2", length=4, first="1650-3", last="1900-10", delayed=1, dead=2,
               added=7, at_ms=700)
    merged = merge_stats("s", [a, b])
    assert (merged.stream, merged.length, merged.first_id, merged.last_id) == (
        "s", 7, "1650-3", "1900-10")  # ids compare as numbers, not as text
    assert (merged.delayed_total, merged.delayed_due, merged.dead) == (3, 1, 3)
    assert (merged.entries_added, merged.taken_at_ms, merged.groups) == (17, 700, [])


def test_an_unknown_figure_on_any_partition_is_unknown_in_the_sum() -> None:
    a = stream("s#0.2", group("g", lag=4, read=None), added=None)
    b = stream("s#1.2", group("g", lag=None, read=5))
    merged = merge_stats("s", [a, b])
    assert merged.entries_added is None
    assert (merged.groups[0].lag, merged.groups[0].entries_read) == (None, None)


def test_groups_merge_by_name_and_a_worker_counts_once() -> None:
    w1_a, w2_a = ConsumerStats("w1", 2, 5.0), ConsumerStats("w2", 1, 0.5)
    w1_b, w3_b = ConsumerStats("w1", 3, 1.0), ConsumerStats("w3", 0, 9.0)
    a = stream("s#0.2", group("billing", pending=3, lag=2, read=10, last="100-1",
                              oldest=4.0, oldest_id="90-0", consumers=[w1_a, w2_a],
                              waiting=1, retry_lag=1, due=1), group("audit", lag=1))
    b = stream("s#1.2", group("billing", pending=3, lag=5, read=20, last="99-7",
                              oldest=8.0, oldest_id="80-0", consumers=[w1_b, w3_b],
                              waiting=2, retry_lag=0))
    audit, billing = merge_stats("s", [a, b]).groups
    assert (audit.name, audit.lag, audit.consumers) == ("audit", 1, 0)
    assert billing.consumers == 3  # w1 works on both partitions: one consumer
    assert billing.consumer_list == [ConsumerStats("w1", 5, 1.0), ConsumerStats("w2", 1, 0.5),
                                     ConsumerStats("w3", 0, 9.0)]
    assert billing.top_consumers == [("w1", 5), ("w2", 1)]  # nothing pending: not "top"
    assert (billing.pending, billing.lag, billing.entries_read) == (6, 7, 30)
    assert (billing.oldest_pending_age_s, billing.oldest_pending_id) == (8.0, "80-0")
    assert billing.last_delivered_id == "100-1"
    assert (billing.retries_waiting, billing.retry_lag, billing.retries_due) == (3, 1, 1)


def test_nothing_pending_anywhere_has_no_oldest() -> None:
    merged = merge_stats("s", [stream("s#0.2", group("g")), stream("s#1.2", group("g"))])
    assert (merged.groups[0].oldest_pending_age_s, merged.groups[0].oldest_pending_id) == (
        None, None)
    assert merge_stats("s", []).last_id == "0-0"


def test_partition_base() -> None:
    assert partition_base("orders#2.4") == "orders"
    assert partition_base("a#b#0.2") == "a#b"
    assert [partition_base(n) for n in ("orders", "orders#2", "orders#x.4", "#1.2")] == [
        None, None, None, None]


def test_rates_from_two_samples() -> None:
    before = stream("s", group("g", pending=2, read=10), length=5, added=100, at_ms=1000)
    after = stream("s", group("g", pending=4, read=30), length=9, added=140, at_ms=3000)
    rates = compute_rates(before, after)
    assert (rates.interval_s, rates.produced_per_s, rates.acked_per_s) == (
        2.0, 20.0, {"g": 9.0})  # read 20, of which 2 still held: 18 acked in 2 s
    assert compute_rates(before, before).produced_per_s is None  # no time passed


def test_rates_between_frames_include_each_partition() -> None:
    def split(total: StreamStats, first: StreamStats) -> StreamStats:
        return replace(total, partitions=(PartitionStats(0, "s#0.2", first),
                                          PartitionStats(1, "s#1.2", None)), partition_count=2)

    before = [split(stream("s", added=10, at_ms=0), stream("s#0.2", added=10, at_ms=0))]
    after = [split(stream("s", added=30, at_ms=1000), stream("s#0.2", added=30, at_ms=1000)),
             stream("new", added=1, at_ms=1000)]
    rates = rates_between(before, after)
    assert sorted(rates) == ["s", "s#0.2"]  # "new" has no earlier sample, s#1.2 no stream
    assert rates["s"].produced_per_s == rates["s#0.2"].produced_per_s == 20.0


def test_reading_replies() -> None:
    assert [text(b"caf\xc3\xa9"), text(b"\xff"), text(7)] == ["café", "\ufffd", "7"]
    assert [opt_int(None), opt_int(b"12"), opt_int("x"), opt_int(3)] == [None, 12, None, 3]
    assert norm({b"name": 1, "lag": 2}) == {"name": 1, "lag": 2}
    assert norm([b"name", b"g", b"lag", 3]) == {"name": b"g", "lag": 3}
    assert norm(None) == {}
    assert (entry_id([b"5-1", []]), entry_id(None)) == ("5-1", None)
    assert sorted(["10-0", "9-12", "9-2", "junk"], key=id_order) == [
        "junk", "9-2", "9-12", "10-0"]
    assert id_order("17") == (17, 0)
