"""Money, time and ids in payloads and results: Decimal, UUID, date and aware datetimes
round-trip exactly through MessagePack extension types (send -> worker -> msg.payload ->
result), naive datetimes are refused on send, typed payloads keep such fields, and a
`sw.Codec` carries a user's own types (a decoder failing dead-letters payload:invalid).
Real Redis; the worker runs in-process (`run_until_idle`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Any

import msgpack
import msgspec
import pydantic
import pytest
import redis
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamwork as sw
from streamwork._cli.main import main
from streamwork._ops.deadletter import list_dead
from streamwork._wire.codec import BODY_FIELD, FORMAT_VERSION, decode_body, encode_body
from streamwork._wire.keys import StreamKeys
from streamwork._wire.schedules import check_schedules
from streamwork.testing import run_until_idle

STREAM, GROUP = "payments", "ledger"
UTC = dt.timezone.utc
CET = dt.timezone(dt.timedelta(hours=1))
AT = dt.datetime(2026, 3, 1, 12, 30, 45, 123456, tzinfo=CET)  # microseconds kept
ID = uuid.UUID("12345678-1234-5678-1234-567812345678")
PAYMENT = {"amount": Decimal("0.10"), "big": Decimal("-1.5E+7"), "at": AT,
           "day": dt.date(2026, 3, 1), "id": ID, "lines": [Decimal("19.990"), ID]}


class Collect(sw.StreamWorker[Any]):
    """Keeps every payload and returns it (the result is a done record)."""

    stream, group = STREAM, GROUP
    read_block = 0.05
    retry_delay = 0.01

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.got: list[Any] = []

    async def handle(self, msg: sw.Message[Any]) -> Any:
        self.got.append(msg.payload)
        return msg.payload


def check_payment(got: dict[str, Any]) -> None:
    """``got`` equals PAYMENT exactly: same types, the Decimals' exact digits, the instant
    to the microsecond (read back as UTC)."""
    assert got == PAYMENT
    assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in PAYMENT.items()}
    assert str(got["amount"]) == "0.10" and str(got["big"]) == "-1.5E+7"
    assert str(got["lines"][0]) == "19.990"
    assert got["at"].tzinfo == UTC and got["at"].microsecond == 123456
    assert got["at"] == AT.astimezone(UTC)


async def test_each_type_round_trips_exactly_through_a_worker(redis_url: str,
                                                              r: redis.Redis) -> None:
    """Decimal, aware datetime, date and UUID sent by a producer reach msg.payload as the
    same values, and the handler's result holding them comes back from result()."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, PAYMENT, key="pay-1")
        w = Collect.from_url(redis_url)
        await run_until_idle(w, r, timeout=30)
        [got] = w.got
        check_payment(got)
        check_payment(p.result(STREAM, "pay-1", timeout=10))
        st_ = p.status(STREAM, "pay-1")
        assert (st_.state, st_.result_note) == ("done", "")


async def test_async_producer_and_send_many_carry_them(redis_url: str,
                                                       r: redis.Redis) -> None:
    """AsyncProducer.send and send_many (one script call) carry the ext types too."""
    async with sw.AsyncProducer.from_url(redis_url) as ap:
        await ap.send(STREAM, PAYMENT, key="a")
        await ap.send_many(STREAM, [PAYMENT, {"n": Decimal("1.000")}], keys=["b", "c"])
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{"n": Decimal(i) / 100} for i in range(50)],
                    keys=[f"n-{i}" for i in range(50)])
    w = Collect.from_url(redis_url)
    await run_until_idle(w, r, timeout=30)
    payments = [g for g in w.got if "amount" in g]
    assert len(payments) == 2
    for g in payments:
        check_payment(g)
    small = sorted(g["n"] for g in w.got if "n" in g)
    assert Decimal("1.000") in small and str(small[-1]) == "1.000"
    assert [str(x) for x in small[:3]] == ["0", "0.01", "0.02"]
    async with sw.AsyncProducer.from_url(redis_url) as ap:
        check_payment(await ap.result(STREAM, "a", timeout=10))


async def test_partitioned_stream(redis_url: str, r: redis.Redis) -> None:
    """On a partitioned stream every partition's jobs keep their ext values."""
    keys = [f"pay-{i}" for i in range(12)]
    with sw.Producer.from_url(redis_url, partitions=3) as p:
        p.send_many(STREAM, [{**PAYMENT, "i": i} for i in range(12)], keys=keys)
        p.send(STREAM, {**PAYMENT, "i": 12}, key="pay-12", order_key="acct-1")
        w = Collect.from_url(redis_url, partitions=3)
        await run_until_idle(w, r, timeout=40)
        assert sorted(g.pop("i") for g in w.got) == list(range(13))
        for g in w.got:
            check_payment(g)
        got = p.result(STREAM, "pay-5", timeout=10)
        assert got.pop("i") == 5
        check_payment(got)


def test_naive_datetime_is_refused_with_a_clear_message(redis_url: str,
                                                        r: redis.Redis) -> None:
    """A naive datetime cannot be sent (which instant it means depends on the machine):
    ConfigError saying to attach a time zone; nothing is enqueued, send_many included."""
    naive = dt.datetime(2026, 3, 1, 12, 0)
    with sw.Producer.from_url(redis_url) as p:
        with pytest.raises(sw.ConfigError) as info:
            p.send(STREAM, {"at": naive})
        assert info.value.option == "payload"
        assert "naive datetime" in str(info.value)
        assert "datetime.now(timezone.utc)" in str(info.value)
        with pytest.raises(sw.ConfigError, match="attach a time zone"):
            p.send_many(STREAM, [{"ok": AT}, {"nested": [naive]}])
        with pytest.raises(sw.ConfigError, match="naive datetime"):
            p.send(STREAM, {"at": AT}, delay=5)  # fine ...
            p.send(STREAM, {"at": naive}, delay=5)  # ... not this one
    assert r.xlen(STREAM) == 0
    assert r.zcard(StreamKeys.for_stream(STREAM).delayed) == 1  # the aware one


def test_the_wire_holds_ext_types_another_language_reads() -> None:
    """The documented layouts: ext 1 the Decimal's str, ext 2 the UUID's 16 bytes, ext 3
    YYYY-MM-DD, a datetime the MessagePack timestamp (ext -1); and a body written by
    hand in that layout decodes to the same values."""
    data = encode_body("k", PAYMENT, enqueued_ms=1)
    raw = msgpack.unpackb(data, ext_hook=lambda c, d: (c, d))["p"]
    assert raw["amount"] == (1, b"0.10") and raw["big"] == (1, b"-1.5E+7")
    assert raw["id"] == (2, ID.bytes)
    assert raw["day"] == (3, b"2026-03-01")
    assert raw["at"] == msgpack.Timestamp.from_datetime(AT)
    hand = msgpack.packb({"v": FORMAT_VERSION, "k": "k", "t": 1, "h": {}, "p": {
        "amount": msgpack.ExtType(1, b"0.10"), "id": msgpack.ExtType(2, ID.bytes),
        "day": msgpack.ExtType(3, b"2026-03-01"),
        "at": msgpack.Timestamp(seconds=int(AT.timestamp()), nanoseconds=123456000)}})
    assert decode_body(hand).payload == {"amount": Decimal("0.10"), "id": ID,
                                         "day": dt.date(2026, 3, 1), "at": AT}


# ------------------------------------------------------------------ typed payloads


@dataclasses.dataclass
class PaymentDC:
    amount: Decimal
    at: dt.datetime
    id: uuid.UUID
    day: dt.date


class PaymentStruct(msgspec.Struct):
    amount: Decimal
    at: dt.datetime
    id: uuid.UUID
    day: dt.date


class PaymentModel(pydantic.BaseModel):
    amount: Decimal
    at: dt.datetime
    id: uuid.UUID
    day: dt.date


@pytest.mark.parametrize("kind", [PaymentDC, PaymentStruct, PaymentModel],
                         ids=lambda k: k.__name__)
async def test_typed_payloads_keep_money_and_time(redis_url: str, r: redis.Redis,
                                                  kind: type) -> None:
    """A dataclass / msgspec.Struct / pydantic instance with Decimal, datetime, UUID and
    date fields is sent with ext types (not strings) and validates back exactly."""
    sent = kind(amount=Decimal("0.10"), at=AT, id=ID, day=dt.date(2026, 3, 1))
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, sent, key="typed")
        p.send_many(STREAM, [sent], keys=["typed-many"])
        raw = decode_body(r.xrange(STREAM)[0][1][BODY_FIELD]).payload
        assert type(raw["amount"]) is Decimal and type(raw["id"]) is uuid.UUID
        assert type(raw["at"]) is dt.datetime and type(raw["day"]) is dt.date
        w = Collect.from_url(redis_url, payload_type=kind)
        await run_until_idle(w, r, timeout=30)
        assert len(w.got) == 2
        for got in w.got:
            assert type(got) is kind
            assert str(got.amount) == "0.10" and got.id == ID
            assert got.at == AT and got.at.microsecond == 123456
            assert got.day == dt.date(2026, 3, 1)
        assert w.counts["dead_lettered"] == 0


# ------------------------------------------------------------------ a user's codec


class Money:
    """A user's own type: an amount and a currency (a plain class: a dataclass inside a
    typed payload would be turned into a map by msgspec or pydantic before any codec)."""

    __slots__ = ("amount", "currency")

    def __init__(self, amount: Decimal, currency: str) -> None:
        self.amount, self.currency = amount, currency

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Money)
                and (str(other.amount), other.currency) == (str(self.amount), self.currency))

    def __hash__(self) -> int:
        return hash((str(self.amount), self.currency))

    def __repr__(self) -> str:
        return f"Money({self.amount!r}, {self.currency!r})"

    def to_bytes(self) -> bytes:
        return f"{self.amount} {self.currency}".encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Money:
        amount, currency = data.decode().split(" ")
        if currency == "XXX":
            raise ValueError("no such currency: XXX")
        return cls(Decimal(amount), currency)


class Opaque:
    """Not a dataclass: a type only a codec can carry."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.value == self.value

    __hash__ = None  # type: ignore[assignment]


def money_codec() -> sw.Codec:
    return (sw.Codec().register(Money, 40, encode=Money.to_bytes, decode=Money.from_bytes)
            .register(Opaque, 41, encode=lambda o: o.value.encode(),
                      decode=lambda d: Opaque(d.decode())))


class WithCodec(Collect):
    codec = money_codec()  # as a class attribute


async def test_a_codec_type_round_trips_in_payload_and_result(redis_url: str,
                                                              r: redis.Redis) -> None:
    """A registered type goes out as its ext code and comes back as itself in msg.payload
    and, as the handler's result, from result() of a producer with the same codec."""
    price = Money(Decimal("12.50"), "EUR")
    with sw.Producer.from_url(redis_url, codec=money_codec()) as p:
        p.send(STREAM, {"price": price, "tag": Opaque("x"), "at": AT}, key="m-1")
        p.send_many(STREAM, [[price, price]], keys=["m-2"])
        w = WithCodec.from_url(redis_url)
        await run_until_idle(w, r, timeout=30)
        assert {"price": price, "tag": Opaque("x"), "at": AT} in w.got
        assert [price, price] in w.got
        assert p.result(STREAM, "m-1", timeout=10) == {"price": price, "tag": Opaque("x"),
                                                       "at": AT}
        assert p.result(STREAM, "m-2", timeout=10) == [price, price]
    async with sw.AsyncProducer.from_url(redis_url, codec=money_codec()) as ap:
        assert await ap.result(STREAM, "m-2", timeout=10) == [price, price]
    # without the codec the record is still readable: the ext value is kept as it is
    with sw.Producer.from_url(redis_url) as plain:
        assert plain.result(STREAM, "m-2", timeout=10) == [
            msgpack.ExtType(40, b"12.50 EUR")] * 2


class PricedStruct(msgspec.Struct):
    price: Money
    tags: list[Opaque]
    at: dt.datetime


class PricedModel(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
    price: Money
    tags: list[Opaque]
    at: dt.datetime


@pytest.mark.parametrize("kind", [PricedStruct, PricedModel], ids=lambda k: k.__name__)
async def test_typed_payloads_with_codec_fields(redis_url: str, r: redis.Redis,
                                               kind: type) -> None:
    """A msgspec.Struct or pydantic model with fields of codec types is sent with their ext
    codes and validates back on a worker with the codec."""
    price = Money(Decimal("0.99"), "USD")
    with sw.Producer.from_url(redis_url, codec=money_codec()) as p:
        p.send(STREAM, kind(price=price, tags=[Opaque("a"), Opaque("b")], at=AT), key="t")
    raw = msgpack.unpackb(r.xrange(STREAM)[0][1][BODY_FIELD], ext_hook=lambda c, d: (c, d))
    assert raw["p"]["price"] == (40, b"0.99 USD") and raw["p"]["tags"][1] == (41, b"b")
    w = WithCodec.from_url(redis_url, payload_type=kind)
    await run_until_idle(w, r, timeout=30)
    [got] = w.got
    assert type(got) is kind and got.price == price and got.at == AT
    assert got.tags == [Opaque("a"), Opaque("b")]


async def test_a_decoder_that_raises_dead_letters_payload_invalid(redis_url: str,
                                                                   r: redis.Redis) -> None:
    """A payload the codec's decoder fails on is dead-lettered at once as payload:invalid
    with the error's type and message, its job key and bytes kept; the job's status says
    dead; the worker goes on with the next jobs."""
    with sw.Producer.from_url(redis_url, codec=money_codec()) as p:
        p.send(STREAM, {"price": Money(Decimal("1"), "XXX")}, key="bad")
        p.send(STREAM, {"price": Money(Decimal("2"), "EUR")}, key="good")
        w = WithCodec.from_url(redis_url)
        await run_until_idle(w, r, timeout=30)
        assert w.got == [{"price": Money(Decimal("2"), "EUR")}]
        assert w.counts["dead_lettered"] == 1 and w.counts["retried"] == 0
        [dead] = list_dead(r, STREAM, 10)
        assert (dead.reason, dead.key, dead.attempts) == ("payload:invalid", "bad", 1)
        assert dead.error_type == "InvalidPayload"
        assert "ValueError: no such currency: XXX" in dead.detail
        assert "Money (ext 40)" in dead.detail
        st_ = p.status(STREAM, "bad")
        assert (st_.state, st_.reason) == ("dead", "payload:invalid")
        with pytest.raises(sw.JobFailed):
            p.result(STREAM, "bad", timeout=10)


async def test_a_result_the_producers_decoder_fails_on(redis_url: str,
                                                       r: redis.Redis) -> None:
    """A result the producer's codec cannot decode raises DecodeError result:invalid from
    status() and result(), naming the decoder's error; a producer without the codec
    still reads the record (the value kept as its ext type)."""
    class Returns(WithCodec):
        async def handle(self, msg: sw.Message[Any]) -> Any:
            return {"refund": Money(Decimal("5"), "XXX")}

    with sw.Producer.from_url(redis_url, codec=money_codec()) as p:
        p.send(STREAM, {}, key="refund")
        await run_until_idle(Returns.from_url(redis_url), r, timeout=30)
        with pytest.raises(sw.DecodeError, match="no such currency") as info:
            p.result(STREAM, "refund", timeout=10)
        assert info.value.reason == "result:invalid"
    with sw.Producer.from_url(redis_url) as plain:
        assert plain.result(STREAM, "refund", timeout=10) == {
            "refund": msgpack.ExtType(40, b"5 XXX")}


async def test_malformed_builtin_ext_and_unknown_codes(redis_url: str,
                                                       r: redis.Redis) -> None:
    """From another language: a Decimal ext that is not a number is payload:invalid (with
    its key); an ext code no codec registers is schema:unsupported_ext, as before."""
    def hand(key: str, payload: Any) -> bytes:
        return msgpack.packb({"v": FORMAT_VERSION, "k": key, "t": 1, "h": {}, "p": payload})

    r.xadd(STREAM, {BODY_FIELD: hand("nan-ish", {"amount": msgpack.ExtType(1, b"ten")})})
    r.xadd(STREAM, {BODY_FIELD: hand("short-uuid", msgpack.ExtType(2, b"\x01\x02"))})
    r.xadd(STREAM, {BODY_FIELD: hand("foreign", msgpack.ExtType(40, b"1 EUR"))})
    r.xadd(STREAM, {BODY_FIELD: hand("fine", {"amount": msgpack.ExtType(1, b"10")})})
    w = Collect.from_url(redis_url)  # no codec: ext 40 is unknown here
    await run_until_idle(w, r, timeout=30)
    assert w.got == [{"amount": Decimal("10")}]
    dead = {e.key or e.original["d"]: e for e in list_dead(r, STREAM, 10)}
    assert dead["nan-ish"].reason == "payload:invalid"
    assert "ext type 1 (Decimal)" in dead["nan-ish"].detail
    assert dead["short-uuid"].reason == "payload:invalid"
    assert [e.reason for e in dead.values() if e.key == "foreign"] == [
        "schema:unsupported_ext"]


def test_a_bad_encoder_fails_the_send(redis_url: str, r: redis.Redis) -> None:
    """An encoder that raises or returns anything but bytes fails send and send_many
    with ConfigError naming the type, and nothing is enqueued."""
    def boom(m: Money) -> bytes:
        raise RuntimeError("no rates today")

    raising = sw.Codec().register(Money, 40, encode=boom, decode=Money.from_bytes)
    wrong = sw.Codec().register(Money, 40, encode=lambda m: str(m),  # type: ignore[arg-type,return-value]
                                decode=Money.from_bytes)
    price = Money(Decimal("1"), "EUR")
    with sw.Producer.from_url(redis_url, codec=raising) as p:
        with pytest.raises(sw.ConfigError, match=r"encoder of Money \(ext 40\) raised "
                                                 r"RuntimeError: no rates today"):
            p.send(STREAM, {"price": price})
        with pytest.raises(sw.ConfigError, match="RuntimeError"):
            p.send_many(STREAM, [{"ok": 1}, {"price": price}])
    with (sw.Producer.from_url(redis_url, codec=wrong) as p,
          pytest.raises(sw.ConfigError, match="returned str, not bytes")):
        p.send(STREAM, price)
    with (sw.Producer.from_url(redis_url) as p,  # no codec at all
          pytest.raises(sw.ConfigError, match=r"streamwork\.Codec")):
        p.send(STREAM, price)
    assert not r.exists(STREAM)


def test_codec_registrations_are_checked() -> None:
    """Codes must be 32-127, unique, for a class of the user's own: not one MessagePack
    sends natively, nor one streamwork encodes itself; the option must be a Codec."""
    ok = lambda x: b""  # noqa: E731
    back = lambda d: None  # noqa: E731
    for cls, code, match in [
        (Money, 3, "from 32 to 127"), (Money, 128, "from 32 to 127"),
        (Money, True, "from 32 to 127"), (Decimal, 40, "sent by streamwork itself"),
        (dt.datetime, 40, "sent by streamwork itself"), (uuid.UUID, 40, "itself"),
        (dict, 40, "sends as it is"), (bool, 40, "sends as it is"),
    ]:
        with pytest.raises(sw.ConfigError, match=match):
            sw.Codec().register(cls, code, encode=ok, decode=back)
    codec = sw.Codec().register(Money, 40, encode=ok, decode=back)
    with pytest.raises(sw.ConfigError, match="ext code 40 is registered already"):
        codec.register(Opaque, 40, encode=ok, decode=back)
    with pytest.raises(sw.ConfigError, match="registered already"):
        codec.register(Money, 42, encode=ok, decode=back)
    assert codec.codes == {40: Money} and "40: Money" in repr(codec)
    with pytest.raises(sw.ConfigError, match="codec"):
        sw.Producer.from_url("redis://127.0.0.1:1/0", codec={40: Money})
    with pytest.raises(sw.ConfigError, match="codec"):
        Collect.from_url("redis://127.0.0.1:1/0", codec="money")


def test_misspelt_codec_attribute_is_caught() -> None:
    """`codec` is among the worker's class options: a near miss is refused at start-up."""
    class Typo(Collect):
        codecs = money_codec()

    with pytest.raises(sw.ConfigError, match="codec"):
        Typo.from_url("redis://127.0.0.1:1/0")


def test_schedules_carry_ext_and_codec_types() -> None:
    """A schedule's payload may hold Decimal and datetimes, and the worker's codec types
    (checked with the worker's codec); a naive datetime is refused at once."""
    every = sw.Every(60, payload={"fee": Decimal("0.30"), "price": Money(Decimal(1), "EUR")})
    assert check_schedules([every], codec=money_codec()) == (every,)
    with pytest.raises(sw.ConfigError, match="schedule"):
        check_schedules([every])  # the worker has no codec for Money
    with pytest.raises(sw.ConfigError, match="naive datetime"):
        sw.Every(60, payload={"at": dt.datetime(2026, 1, 1)})


# ------------------------------------------------------------------ tools


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


async def test_cli_shows_ext_values_readably(redis_url: str, r: redis.Redis) -> None:
    """`dlq list --json` and `job --json` show Decimal and UUID as str, dates and
    datetimes in ISO 8601, and an ext type the tool has no codec for as {ext, hex}."""
    class Refuse(WithCodec):
        async def handle(self, msg: sw.Message[Any]) -> Any:
            if msg.key == "keep":
                return {"total": Decimal("0.10"), "price": Money(Decimal(3), "EUR")}
            raise sw.DeadLetter("refused")

    with sw.Producer.from_url(redis_url, codec=money_codec()) as p:
        p.send(STREAM, {**PAYMENT, "price": Money(Decimal("2.00"), "EUR")}, key="refused")
        p.send(STREAM, {"x": 1}, key="keep")
    w = Refuse.from_url(redis_url)
    await run_until_idle(w, r, timeout=30)
    code, out = cli("dlq", "list", STREAM, "--json", "--url", redis_url)
    assert code == 0, out
    [line] = out.splitlines()
    payload = json.loads(line)["payload"]
    assert payload == {
        "amount": "0.10", "big": "-1.5E+7", "at": "2026-03-01T11:30:45.123456+00:00",
        "day": "2026-03-01", "id": str(ID), "lines": ["19.990", str(ID)],
        "price": {"ext": 40, "hex": b"2.00 EUR".hex()}}
    code, out = cli("job", STREAM, "keep", "--json", "--url", redis_url)
    assert code == 0, out
    assert json.loads(out)["result"] == {"total": "0.10",
                                         "price": {"ext": 40, "hex": b"3 EUR".hex()}}
    code, out = cli("job", STREAM, "keep", "--url", redis_url)
    assert code == 0 and "Decimal('0.10')" in out


async def test_result_with_a_naive_datetime_is_not_kept(redis_url: str,
                                                        r: redis.Redis) -> None:
    """A handler returning a naive datetime completes; the result is not kept and the
    note says why (a naive datetime cannot be stored); the jobs after it keep theirs."""
    class Naive(Collect):
        concurrency = 1

        async def handle(self, msg: sw.Message[Any]) -> Any:
            if msg.key == "n":
                return {"at": dt.datetime(2026, 1, 1), "fee": Decimal("1.5")}
            return {"fee": Decimal("0.25"), "key": msg.key}

    with sw.Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{}, {}, {}], keys=["n", "after-1", "after-2"])
        await run_until_idle(Naive.from_url(redis_url), r, timeout=30)
        st_ = p.status(STREAM, "n")
        assert st_.state == "done" and st_.result is None
        assert "naive datetime" in st_.result_note
        for key in ("after-1", "after-2"):
            assert p.result(STREAM, key, timeout=10) == {"fee": Decimal("0.25"), "key": key}


# ------------------------------------------------------------------ property


def _same(a: Any, b: Any) -> bool:
    """Equal and of one type all the way down, Decimals digit for digit (NaN included)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


_offsets = st.integers(-23 * 60, 23 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
_leaves = st.one_of(
    st.decimals(allow_nan=True, allow_infinity=True), st.uuids(), st.dates(),
    st.datetimes(timezones=_offsets), st.integers(-(2**63), 2**64 - 1), st.text(),
    st.binary(), st.none(), st.booleans(), st.floats(allow_nan=False))
def _nest(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(inner, max_size=4),
                     st.dictionaries(st.text(max_size=5), inner, max_size=4))


_payloads = st.recursive(_leaves, _nest, max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_payloads)
def test_property_round_trip(payload: Any) -> None:
    """Any nesting of these values encodes and decodes to the same values; datetimes to
    the same instant, in UTC."""
    def utc(v: Any) -> Any:
        if isinstance(v, dt.datetime):
            return v.astimezone(UTC)
        if isinstance(v, dict):
            return {k: utc(x) for k, x in v.items()}
        if isinstance(v, list):
            return [utc(x) for x in v]
        return v

    back = decode_body(encode_body("k", payload, enqueued_ms=1)).payload
    assert _same(back, utc(payload))
