"""Typed payloads: a worker's ``payload_type`` turns each decoded payload into an instance
before ``handle()``, and a producer turns such instances into plain MessagePack values.

Three kinds are recognised, none of them needed by the core: dataclasses, ``msgspec.Struct``
and pydantic models. Validation is the library's own: ``msgspec.convert`` for structs,
``model_validate`` for pydantic models, and for a dataclass ``msgspec.convert`` when msgspec
is installed, else pydantic's ``TypeAdapter`` when pydantic is, else the dataclass's own
constructor (which checks field names, not their types). A payload that does not validate
raises `InvalidPayload`, which the worker turns into a dead letter ``payload:invalid``;
so does any other error validation raises (a user's validator or ``__post_init__``).

Fields of the wire format's ext types (Decimal, UUID, date, aware datetime) and of a
`Codec`'s types are sent as those types, not as strings, so any reader gets them back.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import functools
import importlib.util
import uuid
from collections.abc import Callable
from typing import Any, Final

import msgpack

from streamwork._text import describe
from streamwork._wire.extensions import Codec, Unencodable, encode_builtin
from streamwork.errors import ConfigError

#: what a converter may raise besides the validators' own errors: a wrong shape altogether
_SHAPE_ERRORS: Final = (TypeError, ValueError, KeyError, AttributeError)
#: payload types sent as they are (no conversion looked for)
PLAIN: Final = frozenset({dict, list, str, int, float, bool, bytes, type(None), tuple})
#: what a typed payload's fields keep as they are: the wire format carries them
_KEPT: Final = (bytes, bytearray, decimal.Decimal, dt.datetime, dt.date, uuid.UUID)
#: scalars a pydantic dump needs no JSON conversion for
_SCALARS: Final = (str, int, float, bool, type(None), bytes, bytearray, *_KEPT)


class InvalidPayload(Exception):
    """A payload does not validate against the worker's ``payload_type``."""


def kind_of(payload_type: object) -> str:
    """Which kind of type this is: "dataclass", "msgspec" or "pydantic"; ConfigError for
    anything else."""
    if isinstance(payload_type, type):
        if dataclasses.is_dataclass(payload_type):
            return "dataclass"
        if any(c.__module__.startswith("msgspec") and c.__name__ == "Struct"
               for c in payload_type.__mro__):
            return "msgspec"
        if callable(getattr(payload_type, "model_validate", None)) and callable(
                getattr(payload_type, "model_dump", None)):
            return "pydantic"
    raise ConfigError("payload_type", f"must be a dataclass, a msgspec.Struct or a pydantic "
                                      f"model class, got {payload_type!r}")


def converter(payload_type: object) -> Callable[[Any], Any]:
    """A function turning a decoded payload into a ``payload_type`` instance, raising
    InvalidPayload with the error's type and message when it does not fit, whatever the
    validation raised (a user's validator may raise anything): one bad payload must cost
    only its own job, never the worker's reader."""
    kind = kind_of(payload_type)
    assert isinstance(payload_type, type)
    convert: Callable[[Any], Any]
    errors: tuple[type[BaseException], ...] = _SHAPE_ERRORS
    if kind == "msgspec" or (kind == "dataclass" and _have("msgspec")):
        import msgspec

        def convert(raw: Any) -> Any:
            return msgspec.convert(raw, payload_type)
        errors = (msgspec.ValidationError, *_SHAPE_ERRORS)
    elif kind == "pydantic":
        import pydantic

        convert = payload_type.model_validate  # type: ignore[attr-defined]
        errors = (pydantic.ValidationError, *_SHAPE_ERRORS)
    elif _have("pydantic"):  # a dataclass, validated by pydantic
        import pydantic

        convert = pydantic.TypeAdapter(payload_type).validate_python
        errors = (pydantic.ValidationError, *_SHAPE_ERRORS)
    else:  # a dataclass and neither library: its constructor checks the field names

        def convert(raw: Any) -> Any:
            if not isinstance(raw, dict):
                raise TypeError(f"expected a map of {payload_type.__name__}'s fields, got "
                                f"{type(raw).__name__}")
            return payload_type(**raw)

    name = payload_type.__name__

    def checked(raw: Any) -> Any:
        try:
            return convert(raw)
        except errors as exc:
            raise InvalidPayload(f"{name}: {describe(exc)}") from exc
        except Exception as exc:  # a validator or __post_init__ of the user's raised
            raise InvalidPayload(f"{name}: {describe(exc)} (raised while validating)") from exc

    return checked


def to_plain(payload: Any, codec: Codec | None = None) -> Any:
    """``payload`` as values the wire format carries: a dataclass, msgspec.Struct or
    pydantic model instance becomes a map (its Decimal, UUID, date and datetime fields,
    and ``codec``'s types, kept as they are); anything else is returned as it is."""
    if type(payload) in PLAIN:
        return payload
    try:
        return _typed_plain(payload, codec)
    except Unencodable as exc:  # says what to do itself (a naive datetime, a codec's error)
        raise ConfigError("payload", str(exc)) from exc
    except (TypeError, ValueError) as exc:  # a field of a type nothing here can send
        raise ConfigError("payload", (
            f"a {type(payload).__name__} cannot be sent: {describe(exc)}; its fields may hold "
            "what MessagePack carries, Decimal, UUID, date, aware datetime, or a type "
            "registered with a streamwork.Codec")) from exc


def _typed_plain(payload: Any, codec: Codec | None) -> Any:
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        if _have("msgspec"):
            return _msgspec_plain(payload, codec)
        return dataclasses.asdict(payload)
    if hasattr(type(payload), "__struct_fields__"):
        return _msgspec_plain(payload, codec)
    dump = getattr(payload, "model_dump", None)
    if callable(dump) and not isinstance(payload, type):
        return _jsonable(dump(mode="python"), codec)
    return payload


class _Encoded(bytes):
    """A codec type's ext data, carried through ``msgspec.to_builtins`` in a memoryview
    (a type it passes through) and turned into a `msgpack.ExtType` after."""

    code: int


def _msgspec_plain(payload: Any, codec: Codec | None) -> Any:
    """``msgspec.to_builtins`` of a struct or dataclass, keeping the wire's ext types (and
    ``codec``'s, which msgspec hands to ``enc_hook``, as it does subclasses of the kept
    types)."""
    import msgspec

    encode = encode_builtin if codec is None else codec.encode
    found: list[int] = []

    def enc_hook(obj: Any) -> Any:
        ext = encode(obj)  # Unencodable / TypeError for a type it does not know
        if not isinstance(ext, msgpack.ExtType):  # an aware datetime subclass: a Timestamp
            return ext.to_datetime()
        data = _Encoded(ext.data)
        data.code = ext.code
        found.append(1)
        return memoryview(data)

    plain = msgspec.to_builtins(payload, builtin_types=(*_KEPT, memoryview),
                                enc_hook=enc_hook)
    return _with_ext(plain) if found else plain


def _with_ext(value: Any) -> Any:
    """``value`` with the memoryviews over `_Encoded` data made ext values again."""
    t = type(value)
    if t is dict:
        return {_with_ext(k): _with_ext(v) for k, v in value.items()}
    if t is list or t is tuple:
        return [_with_ext(v) for v in value]
    if t is memoryview and isinstance(value.obj, _Encoded):
        return msgpack.ExtType(value.obj.code, bytes(value.obj))
    return value


def _jsonable(value: Any, codec: Codec | None) -> Any:
    """A pydantic ``model_dump(mode="python")`` with the values the wire format does not
    carry (enums, sets, paths, ...) as ``mode="json"`` would give them: the ext types and
    ``codec``'s types are kept."""
    if isinstance(value, _SCALARS):
        if isinstance(value, (str, int)) and type(value) not in (str, int, bool):
            return _json_leaf(value)  # a str or int enum member: its value
        return value
    t = type(value)
    if t is dict:
        return {_jsonable(k, codec): _jsonable(v, codec) for k, v in value.items()}
    if t is list or t is tuple:
        return [_jsonable(v, codec) for v in value]
    if codec is not None and codec.handles(t):
        return value
    return _json_leaf(value)


def _json_leaf(value: Any) -> Any:
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value)


@functools.cache
def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
