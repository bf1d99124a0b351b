"""MessagePack extension types: money, time and ids on the wire, and `Codec` for your own.

Built in (any producer and worker, no option needed):

* ``decimal.Decimal`` - ext type 1, data: its exact string form, ASCII (``str(d)``:
  ``"0.10"``, ``"-1.5E+7"``, ``"NaN"``), so ``Decimal("0.10")`` comes back as ``"0.10"``;
* ``uuid.UUID`` - ext type 2, data: its 16 bytes, big-endian (``UUID.bytes``);
* ``datetime.date`` - ext type 3, data: ISO 8601 ``YYYY-MM-DD``, ASCII (10 bytes);
* an aware ``datetime.datetime`` - the MessagePack spec's timestamp extension (type -1,
  read as UTC: the instant is kept to the microsecond, the original UTC offset is not).
  A naive datetime is refused on send: which instant it means depends on the machine.

Codes 0-31 are streamwork's (those not listed are kept for later); 32-127 are yours, to
register with `Codec` along with an encoder and a decoder. Encoding calls these hooks
only for values MessagePack cannot pack itself, and decoding only for ext values, so a
payload of plain types costs what it did without them.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
import weakref
from collections.abc import Callable
from typing import Any, Final, TypeVar

import msgpack

from streamwork._text import describe, text
from streamwork.errors import ConfigError, DecodeError

T = TypeVar("T")

EXT_DECIMAL: Final = 1  #: ext type of a Decimal: its str() as ASCII
EXT_UUID: Final = 2  #: ext type of a UUID: its 16 bytes
EXT_DATE: Final = 3  #: ext type of a date: YYYY-MM-DD as ASCII
EXT_TIMESTAMP: Final = -1  #: the MessagePack timestamp extension: an aware datetime
RESERVED_CODES: Final = range(32)  #: ext codes streamwork keeps for its own types
USER_CODES: Final = range(32, 128)  #: ext codes a `Codec` may register
#: types MessagePack packs natively (a subclass is packed as its base, never through a
#: codec) and the ones streamwork encodes itself: neither can be registered
_NATIVE: Final = (dict, list, tuple, str, bytes, bytearray, memoryview, int, float,
                  type(None))
_BUILT_IN: Final = (decimal.Decimal, uuid.UUID, dt.date)
_NAMES: Final = {EXT_DECIMAL: "Decimal", EXT_UUID: "UUID", EXT_DATE: "date"}

#: every class any Codec registered: a schedule's payload, checked before the worker's codec
#: is known, may hold these
_EVER_REGISTERED: Final[weakref.WeakSet[type]] = weakref.WeakSet()

NAIVE_DATETIME: Final = (
    "a naive datetime (no tzinfo) cannot be sent, since the instant it means depends on "
    "the machine: attach a time zone, e.g. datetime.now(timezone.utc) or "
    "dt.replace(tzinfo=timezone.utc)")


class Unencodable(TypeError):
    """A value the wire format cannot carry, with a message saying what to do instead."""


class BadExt(Exception):
    """The data of an ext type this side knows did not decode (raised inside ``ext_hook``;
    the body's reader turns it into a ``payload:invalid`` dead letter)."""


def encode_builtin(obj: Any) -> Any:
    """The packer's ``default=``: the built-in ext types; TypeError for anything else."""
    if isinstance(obj, decimal.Decimal):
        return msgpack.ExtType(EXT_DECIMAL, str(obj).encode("ascii"))
    if isinstance(obj, uuid.UUID):
        return msgpack.ExtType(EXT_UUID, obj.bytes)
    if isinstance(obj, dt.datetime):
        if obj.tzinfo is None or obj.utcoffset() is None:
            raise Unencodable(f"{NAIVE_DATETIME} (got {obj!r})")
        try:  # its instant in UTC must be a datetime too, or no reader can decode it
            obj.astimezone(dt.timezone.utc)
        except OverflowError:
            raise Unencodable(f"the datetime {obj!r} is, in UTC, outside the years 1 to "
                              "9999 that a reader can decode: send it as a string") from None
        return msgpack.Timestamp.from_datetime(obj)
    if isinstance(obj, dt.date):
        return msgpack.ExtType(EXT_DATE, obj.isoformat().encode("ascii"))
    raise TypeError(f"can not serialize {type(obj).__name__!r} object")


def decode_builtin(code: int, data: bytes) -> Any:
    """The unpacker's ``ext_hook`` for the built-in types: DecodeError
    ``schema:unsupported_ext`` for any other code, BadExt for data that does not decode."""
    try:
        if code == EXT_DECIMAL:
            return decimal.Decimal(data.decode("ascii"))
        if code == EXT_UUID:
            return uuid.UUID(bytes=data)
        if code == EXT_DATE:
            if len(data) != 10:
                raise ValueError(f"{len(data)} bytes, not 10 (YYYY-MM-DD)")
            return dt.date.fromisoformat(data.decode("ascii"))
    except (ValueError, ArithmeticError) as exc:  # UnicodeDecodeError, InvalidOperation
        raise BadExt(f"MessagePack ext type {code} ({_NAMES[code]}) holds {bytes(data)[:40]!r}"
                     f", which does not decode ({describe(exc)})") from None
    raise DecodeError("schema:unsupported_ext", f"MessagePack ext type {code} is not "
                                                f"supported (no codec registers it)")


class Codec:
    """Your own types in payloads and results, each as a MessagePack extension type.

    ``codec = sw.Codec().register(Money, 40, encode=Money.to_bytes, decode=Money.from_bytes)``
    then ``Producer.from_url(url, codec=codec)`` and a worker's ``codec = codec``: a value
    of ``Money`` (or a subclass) is sent as ext type 40 holding ``encode(value)`` (bytes),
    and read back as ``decode(data)``. Codes are 32-127 (0-31 are streamwork's: Decimal,
    UUID, date); register every type before the codec is used, and give producers and
    workers the same registrations. An encoder that raises or returns anything but bytes
    fails the send (nothing is enqueued); a decoder that raises dead-letters the job as
    ``payload:invalid`` with its error. A worker without the codec dead-letters payloads
    carrying its codes as ``schema:unsupported_ext``.
    """

    __slots__ = ("_by_code", "_by_type")

    def __init__(self) -> None:
        self._by_type: dict[type, tuple[int, Callable[[Any], Any]]] = {}
        self._by_code: dict[int, tuple[type, Callable[[bytes], Any]]] = {}

    def register(self, cls: type[T], code: int, *, encode: Callable[[T], bytes],
                 decode: Callable[[bytes], T]) -> Codec:
        """Send values of ``cls`` as ext type ``code`` (32-127) holding ``encode(value)``,
        read back with ``decode(data)``; returns the codec, so calls chain."""
        if not isinstance(cls, type):
            raise ConfigError("codec", f"register() takes a class, got {cls!r}")
        if issubclass(cls, _NATIVE) or issubclass(cls, bool):
            raise ConfigError("codec", (
                f"{cls.__qualname__} is a {_native_base(cls)}, which MessagePack sends as "
                "it is (a codec is never asked): register a class of your own"))
        if issubclass(cls, _BUILT_IN):
            raise ConfigError("codec", (
                f"{cls.__qualname__} is sent by streamwork itself (Decimal as ext 1, UUID as "
                "ext 2, date as ext 3, aware datetime as a MessagePack timestamp): it "
                "cannot be registered"))
        if type(code) is not int or code not in USER_CODES:
            raise ConfigError("codec", (
                f"the ext code of {cls.__qualname__} must be an int from 32 to 127 (0-31 are "
                f"streamwork's), got {code!r}"))
        if not callable(encode) or not callable(decode):
            raise ConfigError("codec", f"encode= and decode= of {cls.__qualname__} must be "
                                       f"functions, got {encode!r} and {decode!r}")
        if cls in self._by_type:
            raise ConfigError("codec", f"{cls.__qualname__} is registered already (as ext "
                                       f"{self._by_type[cls][0]})")
        if code in self._by_code:
            raise ConfigError("codec", f"ext code {code} is registered already (for "
                                       f"{self._by_code[code][0].__qualname__})")
        self._by_type[cls] = (code, encode)
        self._by_code[code] = (cls, decode)
        _EVER_REGISTERED.add(cls)
        return self

    @property
    def codes(self) -> dict[int, type]:
        """The registered ext codes and their classes."""
        return {code: cls for code, (cls, _) in self._by_code.items()}

    def handles(self, cls: type) -> bool:
        """Whether values of ``cls`` go through this codec (it or a base is registered)."""
        return any(c in self._by_type for c in cls.__mro__)

    def __repr__(self) -> str:
        shown = ", ".join(f"{code}: {cls.__qualname__}" for code, cls in self.codes.items())
        return f"Codec({{{shown}}})"

    def encode(self, obj: Any) -> Any:
        """The packer's ``default=``: a registered type as its ext type (the nearest class
        in its MRO), else the built-in types; Unencodable with the reason otherwise."""
        for cls in type(obj).__mro__:
            found = self._by_type.get(cls)
            if found is not None:
                return _user_ext(cls, *found, obj)
        return encode_builtin(obj)

    def decode(self, code: int, data: bytes) -> Any:
        """The unpacker's ``ext_hook``: a registered code through its decoder (BadExt with
        the decoder's error when it raises), else the built-in types."""
        found = self._by_code.get(code)
        if found is None:
            return decode_builtin(code, data)
        cls, decode = found
        try:
            return decode(bytes(data))
        except Exception as exc:  # the user's decoder: any error costs only its own job
            raise BadExt(f"the codec's decoder of {cls.__qualname__} (ext {code}) raised "
                         f"{describe(exc)}") from exc


def _user_ext(cls: type, code: int, encode: Callable[[Any], Any], obj: Any) -> msgpack.ExtType:
    try:
        data = encode(obj)
    except Exception as exc:
        raise Unencodable(f"the codec's encoder of {cls.__qualname__} (ext {code}) raised "
                          f"{describe(exc)}") from exc
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise Unencodable(f"the codec's encoder of {cls.__qualname__} (ext {code}) returned "
                          f"{text(type(data).__name__)}, not bytes")
    return msgpack.ExtType(code, bytes(data))


def _native_base(cls: type) -> str:
    return next(b.__name__ for b in cls.__mro__ if b in (*_NATIVE, bool))


def registered_anywhere(cls: type) -> bool:
    """Whether some `Codec` of this process registered ``cls`` (or a base of it)."""
    return any(c in _EVER_REGISTERED for c in cls.__mro__)


def check_codec(value: object) -> Codec | None:
    """A ``codec`` option: None or a `Codec`."""
    if value is None or isinstance(value, Codec):
        return value
    raise ConfigError("codec", f"must be a streamwork.Codec (or None), got {value!r}")


def packer(codec: Codec | None = None) -> msgpack.Packer:
    """A Packer for bodies and results: the wire format's own settings plus the ext types
    (``codec``'s and the built-in ones). Not thread-safe: one per thread or per call."""
    # datetimes go through ``default`` (encode_builtin), which checks their range
    return msgpack.Packer(use_bin_type=True, datetime=False,
                          default=encode_builtin if codec is None else codec.encode)


def ext_hook(codec: Codec | None, *, keep: bool = False,
             keep_bad: bool = False) -> Callable[[int, bytes], Any]:
    """The unpacker's ``ext_hook`` for ``codec`` (None: the built-in types only). ``keep``:
    an ext type it does not know stays a `msgpack.ExtType` instead of failing the read;
    ``keep_bad``: so does one whose data does not decode (for tools showing what is
    stored)."""
    hook = decode_builtin if codec is None else codec.decode
    if not keep and not keep_bad:
        return hook

    def keeping(code: int, data: bytes) -> Any:
        try:
            return hook(code, data)
        except DecodeError:  # a code nobody here registered
            if not keep:
                raise
        except BadExt:
            if not keep_bad:
                raise
        return msgpack.ExtType(code, bytes(data))
    return keeping


def to_json(value: Any) -> Any:
    """``value`` (a decoded payload or result) with what JSON cannot show made readable:
    Decimal and UUID as their str, date and datetime in ISO 8601, bytes as hex, an ext
    type nobody here decodes as ``{"ext": code, "hex": data}``, map keys as str."""
    t = type(value)
    if t in (str, int, float, bool) or value is None:
        return value
    if t is dict:
        return {k if type(k) is str else _key_text(k): to_json(v) for k, v in value.items()}
    if t in (list, tuple):
        return [to_json(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, msgpack.ExtType):
        return {"ext": value.code, "hex": value.data.hex()}
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    return text(value)


def _key_text(key: Any) -> str:
    shown = to_json(key)
    return shown if isinstance(shown, str) else text(shown)
