"""Key names (keys.py): one hash tag per stream, Cluster slots, and the rules for names.

Pure: no Redis.
"""

from __future__ import annotations

import binascii
import random
import string
from collections.abc import Callable
from typing import Any

import pytest
import redis
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamwork._redis.server import free_port
from streamwork._wire.keys import MAX_NAME_BYTES, StreamKeys, check_name
from streamwork.errors import ConfigError
from tests.helpers.slots import key_slot


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def derived(keys: StreamKeys, job_key: str, group: str = "billing") -> list[str]:
    g = keys.group(group)
    return [keys.dead, keys.delayed, keys.fence, keys.partitions, g.retry, g.retries,
            g.job(job_key), g.job_prefix, g.owner, g.members, g.settings, g.paused]


def test_names_of_owned_keys_are_refused_as_streams() -> None:
    """A stream may not be named like a key streamwork keeps for another stream."""
    for name in ("{orders}:dead", "{orders}:retry:7:billing", "{orders}~3:a:b", "{x}:fence",
                 "{orders}:partitions", "{orders}:owner:7:billing", "{orders}:members:1:g",
                 "{orders}:paused:7:billing"):
        with pytest.raises(ConfigError, match="key streamwork keeps"):
            StreamKeys.for_stream(name)
    for name in ("{orders}:deadline", "{orders}:eu", "orders:dead"):
        StreamKeys.for_stream(name)


def test_plain_stream_gets_its_name_as_hash_tag() -> None:
    """For stream S without braces every derived key starts with {S}; group names and job
    keys follow with their length in front."""
    k = StreamKeys.for_stream("orders")
    g = k.group("billing")
    assert k.stream == "orders"
    assert k.dead == "{orders}:dead"
    assert k.delayed == "{orders}:delayed"
    assert k.fence == "{orders}:fence"
    assert g.retry == "{orders}:retry:7:billing"
    assert g.retries == "{orders}:retries:7:billing"
    assert g.job("order-7") == "{orders}:job:7:billing:order-7"
    assert g.job_prefix == "{orders}:job:7:billing:"


def test_stream_with_tag_keeps_it_and_names_itself() -> None:
    """A stream that already holds a {tag} keeps it, and its whole name (with its length)
    follows, so `orders` and `{orders}` share no key."""
    k = StreamKeys.for_stream("{orders}:eu")
    assert k.dead == "{orders}~11:{orders}:eu:dead"
    assert k.group("g").job("x") == "{orders}~11:{orders}:eu:job:1:g:x"
    plain, tagged = StreamKeys.for_stream("orders"), StreamKeys.for_stream("{orders}")
    assert set(derived(plain, "k")).isdisjoint(derived(tagged, "k"))


def test_all_roles_are_distinct() -> None:
    """No two roles of one stream share a key name."""
    k = StreamKeys.for_stream("s")
    names = [k.stream, *derived(k, "a")]
    assert len(set(names)) == len(names)


# names streamwork accepts: no whitespace/NUL; braces only as one tag in a stream name
_NAME_CHARS = st.characters(blacklist_categories=("Cs", "Zs", "Cc"), blacklist_characters="{}")
_NAMES = st.text(_NAME_CHARS, min_size=1, max_size=12)
_STREAMS = st.one_of(_NAMES, st.builds(lambda a, t, b: f"{a}{{{t}}}{b}",
                                       st.text(_NAME_CHARS, max_size=4), _NAMES,
                                       st.text(_NAME_CHARS, max_size=4)))
_JOB_KEYS = st.text(min_size=1, max_size=12).filter(_utf8)  # job keys: any text at all


def _all_keys(stream: str, group: str, job: str) -> dict[str, str]:
    try:
        k = StreamKeys.for_stream(stream)
    except ConfigError:  # the name of a key streamwork owns: refused, so it cannot collide
        return {}
    g = k.group(group)
    return {"dead": k.dead, "delayed": k.delayed, "fence": k.fence,
            "partitions": k.partitions, "retry": g.retry, "retries": g.retries,
            "owner": g.owner, "members": g.members, "settings": g.settings, "job": g.job(job),
            "paused": g.paused,
            "stream": stream}


@settings(max_examples=400, deadline=None)
@given(st.tuples(_STREAMS, _NAMES, _JOB_KEYS), st.tuples(_STREAMS, _NAMES, _JOB_KEYS))
def test_keys_are_injective(a: tuple[str, str, str], b: tuple[str, str, str]) -> None:
    """Two different (stream, group, job key) triples never share a key, whatever characters
    they hold (`orders` vs `{orders}`, `:` and braces in groups and keys): a job record is
    one group's alone, and no role of one stream is any key of another."""
    ka, kb = _all_keys(*a), _all_keys(*b)
    if not ka or not kb:  # a refused stream name: nothing is ever written under it
        return
    if a == b:
        assert ka == kb
        return
    # a job record names exactly one triple
    assert ka["job"] != kb["job"]
    # per-stream keys are shared only by the same stream, per-group only by the same group
    for role in ("dead", "delayed", "fence", "partitions", "stream"):
        assert (ka[role] == kb[role]) == (a[0] == b[0]), role
    for role in ("retry", "retries", "owner", "members", "settings", "paused"):
        assert (ka[role] == kb[role]) == (a[:2] == b[:2]), role
    # and no key of one triple is a key of another role of the other
    for ra, name_a in ka.items():
        for rb, name_b in kb.items():
            if ra != rb:
                assert name_a != name_b, (ra, rb, name_a)


@example(("orders", "g", "k"), ("{orders}", "g", "k"))
@example(("s", "a:b", "c"), ("s", "a", "b:c"))
@example(("s", "g", "x"), ("s:job:1:g", "g", "x"))
@example(("s", "g", "x"), ("{s}:dead", "g", "x"))
@example(("s", "g", "x"), ("{s}~1:s", "g", "x"))
@given(st.tuples(_STREAMS, _NAMES, _JOB_KEYS), st.tuples(_STREAMS, _NAMES, _JOB_KEYS))
def test_known_collisions_of_the_old_layout_are_gone(a: tuple[str, str, str],
                                                    b: tuple[str, str, str]) -> None:
    """The collisions layout 1 had (`orders` vs `{orders}`, `:` inside names) do not occur."""
    if a != b:
        test_keys_are_injective.hypothesis.inner_test(a, b)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("key", "slot"), [
    ("foo", 12182), ("bar", 5061), ("123456789", 12739), ("", 0),
])
def test_key_slot_known_values(key: str, slot: int) -> None:
    """key_slot is CRC16/XMODEM mod 16384 (known values from the Redis Cluster spec)."""
    assert key_slot(key) == slot
    assert key_slot(key.encode()) == slot


def test_key_slot_hash_tag_rules() -> None:
    """Only the first {...} counts, and only when non-empty; else the whole key is hashed."""
    def whole(k: str) -> int:
        return binascii.crc_hqx(k.encode(), 0) % 16384

    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")
    assert key_slot("{user1000}.following") == whole("user1000")
    assert key_slot("foo{}{bar}") == whole("foo{}{bar}")
    assert key_slot("foo{{bar}}zap") == whole("{bar")
    assert key_slot("foo{bar}{zap}") == whole("bar")
    assert key_slot("{bar") == whole("{bar")


def test_key_slot_agrees_with_a_real_cluster_node(make_server: Callable[..., Any]) -> None:
    """key_slot equals CLUSTER KEYSLOT of a cluster-enabled redis-server for varied keys."""
    # the bus port defaults to port + 10000, which may not exist: give it a free one
    server = make_server(extra_args=["--cluster-enabled", "yes", "--cluster-port",
                                     str(free_port()), "--cluster-config-file", "nodes.conf"])
    client = redis.Redis.from_url(server.url)
    keys = [*_random_names(100), "foo{}{bar}", "foo{{bar}}zap", "{a}{b}", "ä{ü}", "x{"]
    for k in keys:
        for name in [k, *derived_or_none(k)]:
            assert key_slot(name) == client.execute_command("CLUSTER KEYSLOT", name), name
    client.close()


def derived_or_none(stream: str) -> list[str]:
    try:
        return derived(StreamKeys.for_stream(stream), "j")
    except ConfigError:
        return []


def _random_names(n: int) -> list[str]:
    rng = random.Random(19)
    alphabet = string.ascii_letters + string.digits + "-_.:/#@äß✓"
    names = [f"{{t{i}}}:p{i}" for i in range(5)] + ["orders", "a", "x" * 190]
    for _ in range(n):
        names.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40))))
    return names


@pytest.mark.parametrize("stream", _random_names(200))
def test_every_derived_key_shares_the_stream_slot(stream: str) -> None:
    """Every key derived from a stream hashes to the stream's own Cluster slot."""
    k = StreamKeys.for_stream(stream)
    slot = key_slot(stream)
    for name in derived(k, "job-{weird}-key ✓"):
        assert key_slot(name) == slot, name


BAD_NAMES = [
    ("", "empty"),
    ("a b", "space"),
    ("a\tb", "tab"),
    ("a\nb", "newline"),
    ("a\x00b", "NUL"),
    ("{a}b}", "stray brace"),
    ("a{b", "open brace"),
    ("a}b", "close brace"),
    ("{}", "empty tag"),
    ("{a}{b}", "two tags"),
    ("x" * (MAX_NAME_BYTES + 1), "too long"),
    ("é" * (MAX_NAME_BYTES // 2 + 1), "too long in bytes"),
    ("a\udc80", "not UTF-8"),
]


@pytest.mark.parametrize(("name", "why"), BAD_NAMES, ids=[w for _, w in BAD_NAMES])
def test_bad_stream_names_raise_config_error(name: str, why: str) -> None:
    """Invalid stream names raise ConfigError naming the option, before any key is built."""
    with pytest.raises(ConfigError) as info:
        StreamKeys.for_stream(name)
    assert info.value.option == "stream"
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", ["{orders}", "{orders}:eu"])
def test_group_and_consumer_names_may_not_hold_braces(name: str) -> None:
    """A hash tag is fine in a stream name but not in group or consumer names."""
    assert check_name("stream", name, allow_tag=True) == name
    for option in ("group", "consumer"):
        with pytest.raises(ConfigError) as info:
            check_name(option, name)
        assert info.value.option == option


@pytest.mark.parametrize("value", [None, 5, b"orders", ["orders"]])
def test_non_str_names_raise_config_error(value: object) -> None:
    """A name that is not a str raises ConfigError naming the option."""
    with pytest.raises(ConfigError) as info:
        check_name("group", value)
    assert info.value.option == "group"


def test_longest_allowed_name_is_accepted() -> None:
    """Exactly MAX_NAME_BYTES (200) bytes is still a valid name."""
    assert MAX_NAME_BYTES == 200
    assert check_name("stream", "x" * 200) == "x" * 200
    assert StreamKeys.for_stream("x" * 200).dead == "{" + "x" * 200 + "}:dead"
