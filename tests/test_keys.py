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

from streamwork._keys import MAX_NAME_BYTES, StreamKeys, check_name
from streamwork._server import free_port
from streamwork.errors import ConfigError
from tests.slots import key_slot


def derived(keys: StreamKeys, job_key: str) -> list[str]:
    return [keys.dead, keys.delayed, keys.fence, keys.done(job_key), keys.lock(job_key),
            keys.done_prefix, keys.lock_prefix]


def test_plain_stream_gets_its_name_as_hash_tag() -> None:
    """For stream S without braces every derived key is {S}:<role>..."""
    k = StreamKeys.for_stream("orders")
    assert k.stream == "orders"
    assert k.dead == "{orders}:dead"
    assert k.delayed == "{orders}:delayed"
    assert k.fence == "{orders}:fence"
    assert k.done("order-7") == "{orders}:done:order-7"
    assert k.lock("order-7") == "{orders}:lock:order-7"
    assert k.done_prefix == "{orders}:done:"
    assert k.lock_prefix == "{orders}:lock:"


def test_stream_with_tag_reuses_it() -> None:
    """A stream that already holds a {tag} keeps it: derived keys are S:<role>."""
    k = StreamKeys.for_stream("{orders}:eu")
    assert k.dead == "{orders}:eu:dead"
    assert k.lock("x") == "{orders}:eu:lock:x"
    assert "{{" not in k.fence


def test_all_roles_are_distinct() -> None:
    """No two roles of one stream share a key name."""
    k = StreamKeys.for_stream("s")
    names = [k.stream, k.dead, k.delayed, k.fence, k.done("a"), k.lock("a")]
    assert len(set(names)) == len(names)


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
