"""The wire format (codec.py): round trips, and every bad body a worker can meet.

Pure: no Redis. Reason codes are stable (dead letters and metrics carry them),
so each bad input is pinned to its code.
"""

from __future__ import annotations

import json
import random

import msgpack
import pytest

from streamwork._wire.codec import (
    BODY_FIELD,
    DEFAULT_MAX_PAYLOAD_BYTES,
    FORMAT_VERSION,
    decode_body,
    encode_body,
    parse_attempts,
)
from streamwork.errors import ConfigError, DecodeError, PayloadTooLarge, StreamworkError

GOOD_FIELDS = {"v": FORMAT_VERSION, "k": "order-7", "t": 1_700_000_000_000, "h": {}, "p": {"a": 1}}


def body(**changes: object) -> bytes:
    """A hand-built body (as another language would write it), with ``changes`` applied;
    a change to the value ``...`` removes the field."""
    fields = {**GOOD_FIELDS, **changes}
    return msgpack.packb({k: v for k, v in fields.items() if v is not ...}, use_bin_type=True)


def reason_of(data: bytes | None, **kwargs: int) -> str:
    with pytest.raises(DecodeError) as info:
        decode_body(data, **kwargs)
    assert isinstance(info.value, StreamworkError)
    return info.value.reason


@pytest.fixture(name="good")
def _good() -> bytes:
    return encode_body("order-7", {"order_id": 7, "items": [1, 2, 3], "note": "hello world"},
                       {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"})


PAYLOADS = [
    None, True, False, 0, -1, 2**63 - 1, -(2**63), 1.5, "", "ünïcødé ✓", b"\x00\xff raw",
    [], [1, [2, [3]]], {}, {"nested": {"list": [1, "two", b"3", None], "f": 0.25}},
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: type(p).__name__)
def test_round_trip_keeps_key_time_headers_and_payload(payload: object) -> None:
    """encode_body then decode_body gives back the key, enqueue time, headers and payload."""
    data = encode_body("k-1", payload, {"traceparent": "00-x", "tenant": "eu"},
                       enqueued_ms=1_700_000_000_123)
    env = decode_body(data)
    assert env.key == "k-1"
    assert env.enqueued_ms == 1_700_000_000_123
    assert env.headers == {"traceparent": "00-x", "tenant": "eu"}
    assert env.payload == payload
    assert type(env.payload) is type(payload)


def test_body_is_the_documented_versioned_map() -> None:
    """The body is a MessagePack map {v, k, t, h, p} with v == 3 (and "o" only when the job
    has options) and field ``d`` holds it."""
    data = encode_body("k", [1, 2], {"a": "b"}, enqueued_ms=42)
    assert BODY_FIELD == b"d"
    assert FORMAT_VERSION == 3
    assert msgpack.unpackb(data, raw=False) == {"v": 3, "k": "k", "t": 42, "h": {"a": "b"},
                                                "p": [1, 2]}


def test_default_enqueue_time_is_now_in_unix_ms() -> None:
    """Without enqueued_ms the body carries the current time in Unix milliseconds."""
    import time

    before = int(time.time() * 1000)
    env = decode_body(encode_body("k", 1))
    assert before - 5 <= env.enqueued_ms <= int(time.time() * 1000) + 5


def test_foreign_producer_body_decodes() -> None:
    """A body written by hand from the documented format (no 'h') decodes."""
    env = decode_body(msgpack.packb({"v": 1, "k": "x", "t": 5, "p": "hi"}))
    assert (env.key, env.enqueued_ms, env.headers, env.payload) == ("x", 5, {}, "hi")


# ---- bad input, one kind at a time: each gets its own reason code -----------------------


def test_c1_byte_is_a_format_error() -> None:
    """b'\\xc1' (never valid MessagePack) is decode_error:FormatError."""
    assert reason_of(b"\xc1") == "decode_error:FormatError"


def test_random_bytes_only_ever_raise_decode_error() -> None:
    """Random bytes never decode to an envelope and never raise anything but DecodeError."""
    rng = random.Random(1234)
    seen = set()
    for _ in range(3000):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        seen.add(reason_of(data))
    assert all(r.startswith(("decode_error:", "schema:")) for r in seen), seen
    assert any(r.startswith("decode_error:") for r in seen)


def test_json_text_is_rejected() -> None:
    """A JSON document in the body is a decode error, not a silently accepted prefix."""
    data = json.dumps({"v": 1, "k": "x", "t": 1, "p": 1}).encode()
    assert reason_of(data).startswith("decode_error:")


def test_empty_body_is_incomplete() -> None:
    """An empty 'd' field is decode_error:incomplete."""
    assert reason_of(b"") == "decode_error:incomplete"


@pytest.mark.parametrize("cut", [-1, -3, 0.5, 0.75])
def test_truncated_body_is_incomplete(good: bytes, cut: float) -> None:
    """A body cut short is decode_error:incomplete."""
    end = int(len(good) * cut) if isinstance(cut, float) else len(good) + int(cut)
    assert reason_of(good[:end]) == "decode_error:incomplete"


def test_trailing_garbage_is_extra_data(good: bytes) -> None:
    """Bytes after a valid body are decode_error:extra_data (the prefix is not accepted)."""
    assert reason_of(good + b"\x00") == "decode_error:extra_data"
    assert reason_of(good + good) == "decode_error:extra_data"


def test_deep_nesting_hits_limits() -> None:
    """5000-deep nested arrays are decode_error:limits (no RecursionError, no crash)."""
    assert reason_of(b"\x91" * 5000 + b"\x00") == "decode_error:limits"
    deep_in_payload = body(p=None)[:-1] + b"\x91" * 5000 + b"\xc0"
    assert reason_of(deep_in_payload) == "decode_error:limits"


@pytest.mark.parametrize("header", [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff"],
                         ids=["array32", "map32"])
def test_huge_declared_length_hits_limits(header: bytes) -> None:
    """A size bomb (array/map declaring 4 G items) is refused as decode_error:limits."""
    assert reason_of(header + b"\x00" * 8) == "decode_error:limits"


@pytest.mark.parametrize("value", [5, [1, 2], "str", b"bin", None, 1.5, True])
def test_non_map_body_is_envelope_not_map(value: object) -> None:
    """A body that decodes to anything but a map is schema:envelope_not_map."""
    assert reason_of(msgpack.packb(value, use_bin_type=True)) == "schema:envelope_not_map"


@pytest.mark.parametrize("field", ["v", "k", "t", "p"])
def test_missing_field(field: str) -> None:
    """A body without v, k, t or p is schema:missing:<field>."""
    assert reason_of(body(**{field: ...})) == f"schema:missing:{field}"


@pytest.mark.parametrize(("field", "value"), [
    ("v", "1"), ("v", True), ("v", 1.0),
    ("k", 7), ("k", ""), ("k", b"bytes-key"), ("k", None),
    ("t", "now"), ("t", -1), ("t", 1.5), ("t", False),
    ("h", ["traceparent"]), ("h", {"n": 1}), ("h", "x"),
])
def test_wrong_types(field: str, value: object) -> None:
    """A field of the wrong type is schema:type:<field>."""
    assert reason_of(body(**{field: value})) == f"schema:type:{field}"


def test_non_str_map_keys() -> None:
    """A body map with a non-str key is schema:map_key."""
    assert reason_of(msgpack.packb({1: 2})) == "schema:map_key"
    data = msgpack.packb({**GOOD_FIELDS, 9: "x"})
    assert reason_of(data) == "schema:map_key"


def test_unknown_ext_type() -> None:
    """An ext value of a code neither built in nor registered, anywhere in the body, is
    schema:unsupported_ext (codes 1-3 and -1 are the built-in Decimal, UUID, date and
    timestamp)."""
    assert reason_of(body(p=msgpack.ExtType(42, b"xyz"))) == "schema:unsupported_ext"
    assert reason_of(body(p={"deep": [msgpack.ExtType(100, b"")]})) == "schema:unsupported_ext"


@pytest.mark.parametrize("version", [0, 4, 99, -1])
def test_unknown_version(version: int) -> None:
    """A body with another format version is unknown_version."""
    assert reason_of(body(v=version)) == "unknown_version"


def test_version_1_bodies_are_still_read() -> None:
    """Bodies written before the job-record layout (version 1) decode as before."""
    env = decode_body(msgpack.packb({"v": 1, "k": "old", "t": 5, "h": {}, "p": [1]}))
    assert (env.key, env.enqueued_ms, env.payload) == ("old", 5, [1])


def test_too_large_body_checked_before_decoding() -> None:
    """A body over max_payload_bytes is payload_too_large, even when it is not MessagePack."""
    assert reason_of(b"\xc1" * 2000, max_payload_bytes=1000) == "payload_too_large"
    big = encode_body("k", "x" * 5000)
    assert reason_of(big, max_payload_bytes=1000) == "payload_too_large"
    assert reason_of(b"x" * (DEFAULT_MAX_PAYLOAD_BYTES + 1)) == "payload_too_large"


def test_missing_data_field() -> None:
    """An entry with no 'd' field (None body) is schema:no_data_field."""
    assert reason_of(None) == "schema:no_data_field"


def test_invalid_utf8_string_is_a_decode_error() -> None:
    """A str that is not UTF-8 is a DecodeError, not a UnicodeDecodeError escaping."""
    data = body(k="KEY").replace(b"\xa3KEY", b"\xa3\xff\xfe\xfd")
    assert reason_of(data).startswith("decode_error:")


@pytest.mark.parametrize("data", [b"\xc1", b"", b"\xc1\x00", b"\x92\x01", b"\x01\x02",
                                  b"\xdd\xff\xff\xff\xff", b"\x91" * 5000])
def test_every_decode_error_says_what_is_wrong(data: bytes) -> None:
    """Each DecodeError carries a non-empty detail (it becomes the dead letter's 'detail')."""
    with pytest.raises(DecodeError) as info:
        decode_body(data)
    assert info.value.detail.strip(), f"{info.value.reason} has an empty detail"


# ---- the producer side of the codec ---------------------------------------------------


def test_encode_refuses_too_large_payload() -> None:
    """encode_body raises PayloadTooLarge (a ValueError with size and limit) over the limit."""
    with pytest.raises(PayloadTooLarge) as info:
        encode_body("k", "x" * 2000, max_payload_bytes=1000)
    assert info.value.limit == 1000
    assert info.value.size > 2000
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("payload", [object(), {1j: 1}, {"s": {1, 2}}, 2**70])
def test_encode_refuses_unencodable_payload(payload: object) -> None:
    """A payload MessagePack cannot encode raises ConfigError naming 'payload'."""
    with pytest.raises(ConfigError) as info:
        encode_body("k", payload)
    assert info.value.option == "payload"


@pytest.mark.parametrize("key", ["", 7, None, b"k"])
def test_encode_refuses_bad_key(key: object) -> None:
    """A key that is not a non-empty str raises ConfigError naming 'key'."""
    with pytest.raises(ConfigError) as info:
        encode_body(key, 1)  # type: ignore[arg-type]
    assert info.value.option == "key"


@pytest.mark.parametrize("headers", [{"a": 1}, {1: "a"}, {"a": None}])
def test_encode_refuses_bad_headers(headers: dict[object, object]) -> None:
    """Headers that are not str -> str raise ConfigError naming 'headers'."""
    with pytest.raises(ConfigError) as info:
        encode_body("k", 1, headers)  # type: ignore[arg-type]
    assert info.value.option == "headers"


@pytest.mark.parametrize(("raw", "expected"), [
    (None, 0), (b"", 0), (b"3", 3), (b"-2", 0), (b"x", 0), (b"12", 12)])
def test_parse_attempts(raw: bytes | None, expected: int) -> None:
    """The 'a' field parses to a non-negative int; absent or bad values count as 0."""
    assert parse_attempts(raw) == expected


# ---- version 3: the options map -------------------------------------------------------------


def test_options_travel_in_one_map_and_decode_by_name() -> None:
    """A job's options are the body's "o" map (wire fields: l ms, ok, pr), decoded back
    by option name as python values; "o" is left out when the job has none."""
    data = encode_body("k", 1, enqueued_ms=5,
                       options={"timeout": 2.5, "order_key": "c-7", "priority": "low"})
    assert msgpack.unpackb(data)["o"] == {"l": 2500, "ok": "c-7", "pr": "low"}
    assert dict(decode_body(data).options) == {"timeout": 2.5, "order_key": "c-7",
                                              "priority": "low"}
    plain = encode_body("k", 1, options={"order_key": "k", "priority": "normal"})
    assert "o" not in msgpack.unpackb(plain) and decode_body(plain).options == {}


def test_options_are_read_only() -> None:
    options = decode_body(encode_body("k", 1, options={"timeout": 1})).options
    with pytest.raises(TypeError):
        options["timeout"] = 2  # type: ignore[index]


@pytest.mark.parametrize("extra", [{"o": {"zz": [1, 2], "l": 100}}, {"o": {"l": 100}, "x": 1},
                                   {"o": {7: "int key", "l": 100}}])
def test_readers_ignore_what_they_do_not_know(extra: dict[str, object]) -> None:
    """Option fields no option has (a newer producer's), and body fields, are ignored."""
    assert dict(decode_body(body(**extra)).options) == {"timeout": 0.1}


@pytest.mark.parametrize(("o", "reason"), [
    ([1], "schema:type:o"), ({"l": 0}, "schema:type:o.l"), ({"l": "5"}, "schema:type:o.l"),
    ({"ok": ""}, "schema:type:o.ok"), ({"pr": "urgent"}, "schema:type:o.pr"),
])
def test_a_bad_option_value_is_a_schema_error(o: object, reason: str) -> None:
    assert reason_of(body(o=o)) == reason


def test_a_version_2_body_is_read_with_its_limit_as_the_timeout() -> None:
    env = decode_body(msgpack.packb({"v": 2, "k": "k", "t": 1, "h": {"a": "b"}, "p": 1,
                                     "l": 1500}))
    assert (env.headers, dict(env.options)) == ({"a": "b"}, {"timeout": 1.5})
