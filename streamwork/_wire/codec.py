"""The wire format: one stream entry per job, its body a versioned MessagePack map.

Entry fields (byte strings):

* ``d`` - the body: a MessagePack map ``{"v": 3, "k": key, "t": enqueued_ms, "h": headers,
  "p": payload, "o": options}`` (``v`` format version, ``k`` job key as str, ``t`` enqueue
  time in Unix milliseconds as int, ``h`` str->str map incl. W3C ``traceparent``, ``p`` any
  MessagePack, ``o`` the job's options: a map of short str fields, each one declared in
  ``job_options``, left out when the job has none). Readers ignore keys they do not know,
  in the body and in ``o`` (what a newer producer adds: forward compatible).
* ``a`` - optional ASCII integer: deliveries this job already used in earlier entries
  (written by retries, so attempts keep counting across re-enqueues).

Version 2 bodies (the last before ``o``) are still read: their ``"l"`` (time limit in ms)
is the ``timeout`` option and their ``sw-order-key`` / ``sw-priority`` headers the
``order_key`` / ``priority`` options (taken out of the headers). Decoding gives the options
by name, as python values (``msg.options``).

Payloads and results may hold MessagePack extension types: Decimal, UUID, date and aware
datetimes built in, and a `Codec`'s own types (see ``_extensions``).

Decoding is strict: anything else is a DecodeError whose ``reason`` is a stable code
(``decode_error:...``, ``schema:...``, ``unknown_version``, ``payload_too_large``), and an
ext value whose data does not decode is ``payload:invalid`` (`InvalidExt`, which knows the
job's key) when the rest of the body is sound, else ``schema:bad_ext``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from types import MappingProxyType
from typing import Any, Final, NamedTuple

import msgpack

from streamwork._wire.extensions import BadExt, Codec, Unencodable, decode_builtin, ext_hook, packer
from streamwork._wire.job_options import BY_NAME, NO_OPTIONS, check_send, read_wire, wire_map
from streamwork._wire.keys import check_utf8
from streamwork.errors import ConfigError, DecodeError, PayloadTooLarge

#: the body version this code writes. 3 carries the job's options in one map (``o``); a
#: worker of version 2 refuses it (dead-letters it as unknown_version, from where it can be
#: replayed once the workers are upgraded): upgrade workers before producers.
#: (2 came with the per-group job records, key layout 2.)
FORMAT_VERSION: Final = 3
READ_VERSIONS: Final = (1, 2, 3)  #: the body versions this code reads (1 and 2 differ only in v)
BODY_FIELD: Final = b"d"  #: entry field holding the MessagePack body
ATTEMPTS_FIELD: Final = b"a"  #: entry field with deliveries already used by earlier entries
DEFAULT_MAX_PAYLOAD_BYTES: Final = 1024 * 1024  #: bodies above this are refused (1 MiB)
OPTIONS_FIELD: Final = "o"  #: the body's map of job options (version 3)
#: how version 1 and 2 bodies carried options: the body field ``l`` and two headers
V2_LIMIT_FIELD: Final = "l"
V2_HEADERS: Final = {"sw-order-key": "order_key", "sw-priority": "priority"}

#: anything MessagePack can encode (None, bool, int, float, str, bytes, list, dict), Decimal,
#: UUID, date, aware datetime, and the types of the producer's `Codec`
Payload = Any


class Envelope(NamedTuple):
    """A decoded body: the job as the producer sent it (a NamedTuple: cheap to build);
    ``options`` by option name (read-only; only those the job carries)."""

    key: str
    enqueued_ms: int
    headers: dict[str, str]
    payload: Payload
    options: Mapping[str, Any] = NO_OPTIONS


class InvalidExt(DecodeError):
    """A body whose payload holds an ext value that does not decode (a codec's decoder
    raised, or a built-in ext type's data is malformed), the rest of it sound:
    ``payload:invalid``, with the job's ``key``."""

    def __init__(self, detail: str, key: str) -> None:
        super().__init__("payload:invalid", detail)
        self.key = key


def check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of ``headers``, checked to map str to str."""
    hdrs = dict(headers or {})
    for name, value in hdrs.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ConfigError("headers", f"must map str to str, got {name!r}: {value!r}")
    return hdrs


def encode_body(
    key: str,
    payload: Payload,
    headers: Mapping[str, str] | None = None,
    *,
    enqueued_ms: int | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    options: Mapping[str, Any] | None = None,
    codec: Codec | None = None,
) -> bytes:
    """Encode one job body; raise before anything is sent if it is not valid. ``options``
    are job options by ``send`` keyword (``{"timeout": 5}``), checked as ``send`` checks them."""
    return pack_body(key, payload, check_headers(headers),
                     int(time.time() * 1000) if enqueued_ms is None else enqueued_ms,
                     max_payload_bytes, wire_map(check_send(options or {}), key), codec)


def pack_body(key: str, payload: Payload, headers: dict[str, str], enqueued_ms: int,
              max_payload_bytes: int, options: Mapping[str, Any] | None = None,
              codec: Codec | None = None) -> bytes:
    """``encode_body`` for headers already checked (a producer checks them once a batch)
    and ``options`` already a wire map (`job_options.wire_map`)."""
    return pack_bodies([key], [payload], headers, enqueued_ms, max_payload_bytes,
                       options, codec)[0]


def pack_bodies(keys: Sequence[str], payloads: Sequence[Payload], headers: dict[str, str],
                enqueued_ms: int, max_payload_bytes: int,
                options: Mapping[str, Any] | None = None, codec: Codec | None = None,
                own: Sequence[Mapping[str, Any]] | None = None) -> list[bytes]:
    """The bodies of many jobs sharing headers, time and the options map ``options`` (a
    wire map; one send_many): one Packer for all of them; raises for the first that is not
    valid, before any is sent. ``own``: each job's own wire fields (a per-job option such
    as its order key), added to the shared ones. Ext types (built in, and ``codec``'s)
    cost nothing to payloads without them: the packer asks for them only on values it
    cannot pack itself."""
    pack = packer(codec).pack

    def head_of(wire: Mapping[str, Any] | None) -> bytes:
        # the fields every body of the batch shares are packed once; each job adds its
        # key and payload (a map's order means nothing to a reader): 2 small packs per job
        shared: dict[str, Any] = {"v": FORMAT_VERSION, "t": enqueued_ms, "h": headers}
        if wire:
            shared[OPTIONS_FIELD] = dict(wire)
        # a fixmap header for the shared fields plus k and p, the shared fields, then "k"
        packed: bytes = pack(shared)
        return bytes([0x80 | (len(shared) + 2)]) + packed[1:] + b"\xa1k"

    if len(keys) != len(payloads) or (own is not None and len(own) != len(keys)):
        raise ValueError(f"{len(keys)} keys, {len(payloads)} payloads and "
                         f"{'no' if own is None else len(own)} own options: one each per job")
    head = head_of(options)
    heads: Iterable[bytes] = (repeat(head) if own is None else
                              [head_of({**(options or {}), **o}) if o else head for o in own])
    out: list[bytes] = []
    append = out.append
    for key, payload, first in zip(keys, payloads, heads, strict=False):  # lengths checked
        if type(key) is not str or not key:
            raise ConfigError("key", f"must be a non-empty str, got {key!r}")
        try:
            data: bytes = first + pack(key) + b"\xa1p" + pack(payload)
        except (TypeError, ValueError, OverflowError) as exc:
            check_utf8("key", key)  # blame a key that is not UTF-8 on the key
            if isinstance(exc, Unencodable):
                raise ConfigError("payload", str(exc)) from exc  # says what to do itself
            too_big = wide_int(payload)
            if too_big is not None:
                raise ConfigError("payload", too_big) from exc
            raise ConfigError(
                "payload", f"cannot be encoded as MessagePack ({exc}); send dicts, lists, "
                "str, bytes, numbers, bools, None, Decimal, UUID, date or aware datetime "
                "values, or register the type with a streamwork.Codec"
            ) from exc
        if len(data) > max_payload_bytes:
            raise PayloadTooLarge(len(data), max_payload_bytes)
        append(data)
    return out


#: the integers MessagePack can carry: int64 and uint64
INT_RANGE: Final = (-(2**63), 2**64 - 1)


def wide_int(payload: Any, limit: int = 10_000) -> str | None:
    """What to do about the first integer in ``payload`` (looked into dicts, lists and
    tuples, at most ``limit`` values) too wide for MessagePack, naming where it is; None
    if there is none."""
    todo: list[tuple[str, Any]] = [("", payload)]
    while todo and limit > 0:
        limit -= 1
        where, value = todo.pop()
        if type(value) is int and not INT_RANGE[0] <= value <= INT_RANGE[1]:
            at = f" at payload{where}" if where else ""
            return (f"the integer {value}{at} does not fit in 64 bits (MessagePack carries "
                    "-2**63 to 2**64-1): send it as a string (str(n)) or a Decimal "
                    "(decimal.Decimal(n)), and convert it back in the handler")
        if isinstance(value, dict):
            todo.extend((f"{where}[{k!r}]", v) for k, v in reversed(value.items()))
        elif isinstance(value, (list, tuple)):
            todo.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


#: a decoded body as a plain tuple, in Envelope's order (cheaper to build than an Envelope)
Fields = tuple[str, int, dict[str, str], Payload, Mapping[str, Any]]


def decode_body(data: bytes | None, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                codec: Codec | None = None, *, keep_ext: bool = False) -> Envelope:
    """Decode and validate a body; raise DecodeError with a stable reason code.
    ``keep_ext``: an ext type neither built in nor ``codec``'s (or one that does not
    decode) stays a `msgpack.ExtType` instead of failing: for tools that show payloads."""
    return Envelope(*decode_fields(data, max_payload_bytes, codec, keep_ext=keep_ext))


def decode_fields(data: bytes | None, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                  codec: Codec | None = None, *, keep_ext: bool = False) -> Fields:
    """``decode_body`` as a plain tuple (key, enqueued_ms, headers, payload, options)."""
    if data is None:
        raise DecodeError("schema:no_data_field", "the entry has no 'd' field")
    if len(data) > max_payload_bytes:
        raise DecodeError(
            "payload_too_large", f"body is {len(data)} bytes, over max_payload_bytes"
        )
    if not data:
        raise DecodeError("decode_error:incomplete", "the 'd' field is empty")
    try:
        body = _unpackb(data, strict_map_key=False, timestamp=3,  # str, lists, datetimes
                        ext_hook=(decode_builtin if codec is None and not keep_ext
                                  else ext_hook(codec, keep=keep_ext, keep_bad=keep_ext)))
    except DecodeError:
        raise
    except BadExt as exc:
        raise _bad_ext(data, str(exc)) from None
    except OverflowError as exc:  # a timestamp past what a datetime holds
        raise _bad_ext(data, f"a MessagePack timestamp (ext type -1) is out of datetime's "
                             f"range ({exc})") from None
    except msgpack.ExtraData:
        raise DecodeError("decode_error:extra_data", "trailing bytes after the body") from None
    except msgpack.StackError:
        raise DecodeError("decode_error:limits", "nesting too deep") from None
    except msgpack.FormatError as exc:
        detail = str(exc) or f"not MessagePack: invalid first byte 0x{data[0]:02x}"
        raise DecodeError("decode_error:FormatError", detail) from None
    except UnicodeDecodeError as exc:
        raise DecodeError("decode_error:utf8", str(exc)) from None
    except ValueError as exc:
        code = "incomplete" if "incomplete" in str(exc) else "limits"
        raise DecodeError(f"decode_error:{code}", str(exc)) from None
    except Exception as exc:  # msgpack raises a few other types on hostile input
        raise DecodeError(f"decode_error:{type(exc).__name__}", str(exc)) from None
    return _validate(body)


_unpackb: Final = msgpack.unpackb


def _keep(code: int, data: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(code, bytes(data))


def _bad_ext(data: bytes, detail: str) -> DecodeError:
    """The error of a body holding an ext value that does not decode: ``payload:invalid``
    with the job's key when the rest of the body is a sound envelope (the job can be
    named and failed), else ``schema:bad_ext``."""
    try:
        key = _validate(_unpackb(data, strict_map_key=False, ext_hook=_keep))[0]
    except Exception:
        return DecodeError("schema:bad_ext", detail)
    return InvalidExt(detail, key)


def _validate(body: object) -> Fields:
    # fast path: a well-formed body from a streamwork producer
    if type(body) is dict:
        get = body.get
        version, key, enqueued, headers = get("v"), get("k"), get("t"), get("h")
        if (type(version) is int and type(key) is str and key and type(enqueued) is int
                and enqueued >= 0 and "p" in body
                and (headers is None or (type(headers) is dict and (
                    not headers or all(type(n) is str and type(v) is str
                                       for n, v in headers.items()))))):
            # v, k, t and p are there, h when not None, and o (or l) when not None: with
            # nothing else in the body, every key is a known one (so a str)
            known = 4 + (headers is not None)
            if version == FORMAT_VERSION:
                raw = get(OPTIONS_FIELD)
                if len(body) == known + (raw is not None) and (raw is None or type(raw) is dict):
                    return (key, enqueued, {} if headers is None else headers, body["p"],
                            NO_OPTIONS if raw is None else read_wire(raw))
            elif version in READ_VERSIONS:
                limit = get(V2_LIMIT_FIELD)
                if (len(body) == known + (limit is not None)
                        and (limit is None or (type(limit) is int and limit > 0))
                        and not (headers and any(h in headers for h in V2_HEADERS))):
                    return (key, enqueued, {} if headers is None else headers, body["p"],
                            NO_OPTIONS if limit is None
                            else MappingProxyType({"timeout": limit / 1000}))
    return _validate_strictly(body)


def _validate_strictly(body: object) -> Envelope:
    """Find what is wrong with a body, with a stable reason code (or read what the fast
    path leaves to it: a version 2 body's option headers, fields a newer producer added)."""
    if not isinstance(body, dict):
        raise DecodeError("schema:envelope_not_map", f"body is a {type(body).__name__}")
    if any(not isinstance(k, str) for k in body):
        raise DecodeError("schema:map_key", "body keys must be strings")
    for field in ("v", "k", "t", "p"):
        if field not in body:
            raise DecodeError(f"schema:missing:{field}", f"body has no {field!r}")
    version = body["v"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise DecodeError("schema:type:v", "'v' must be an int")
    if version not in READ_VERSIONS:
        raise DecodeError("unknown_version", f"body version {version}; this worker reads "
                                             f"{', '.join(map(str, READ_VERSIONS))}")
    key, enqueued, headers = body["k"], body["t"], body.get("h") or {}
    if not isinstance(key, str) or not key:
        raise DecodeError("schema:type:k", "'k' must be a non-empty str")
    if not isinstance(enqueued, int) or isinstance(enqueued, bool) or enqueued < 0:
        raise DecodeError("schema:type:t", "'t' must be a non-negative int (Unix ms)")
    if not isinstance(headers, dict) or any(
        not isinstance(n, str) or not isinstance(v, str) for n, v in headers.items()
    ):
        raise DecodeError("schema:type:h", "'h' must map str to str")
    if version < 3:
        headers, options = _v2_options(body.get(V2_LIMIT_FIELD), headers)
    else:
        raw = body.get(OPTIONS_FIELD)
        if raw is not None and not isinstance(raw, dict):
            raise DecodeError("schema:type:o", "'o' must be a map of job options")
        options = NO_OPTIONS if raw is None else read_wire(raw)
    return Envelope(key=key, enqueued_ms=enqueued, headers=headers, payload=body["p"],
                    options=options)


def _v2_options(limit: object, headers: dict[str, str]
                ) -> tuple[dict[str, str], Mapping[str, Any]]:
    """A version 1 or 2 body's options: its ``l`` as the timeout, its ``sw-order-key`` and
    ``sw-priority`` headers as the order key and priority (taken out of the headers; one
    that does not read as its option stays a header, as it was)."""
    options: dict[str, Any] = {}
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
            raise DecodeError("schema:type:l", "'l' must be a positive int (milliseconds)")
        options["timeout"] = limit / 1000
    if any(h in headers for h in V2_HEADERS):
        headers = dict(headers)
        for header, name in V2_HEADERS.items():
            if header in headers:
                try:
                    options[name] = BY_NAME[name].read(headers[header])
                except ValueError:
                    continue
                del headers[header]
    return headers, MappingProxyType(options) if options else NO_OPTIONS


def parse_attempts(raw: bytes | None) -> int:
    """Deliveries used by earlier entries of the job (field ``a``); 0 when absent or bad."""
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        return 0
    return max(value, 0)
