"""Typed payloads: a worker's ``payload_type`` turns each decoded payload into an instance
before ``handle()``, and a producer turns such instances into plain MessagePack values.

Three kinds are recognised, none of them needed by the core: dataclasses, ``msgspec.Struct``
and pydantic models. Validation is the library's own: ``msgspec.convert`` for structs,
``model_validate`` for pydantic models, and for a dataclass ``msgspec.convert`` when msgspec
is installed, else pydantic's ``TypeAdapter`` when pydantic is, else the dataclass's own
constructor (which checks field names, not their types). A payload that does not validate
raises `InvalidPayload`, which the worker turns into a dead letter ``payload:invalid``;
so does any other error validation raises (a user's validator or ``__post_init__``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Callable
from typing import Any, Final

from ._usercode import describe
from .errors import ConfigError

#: what a converter may raise besides the validators' own errors: a wrong shape altogether
_SHAPE_ERRORS: Final = (TypeError, ValueError, KeyError, AttributeError)
#: payload types sent as they are (no conversion looked for)
PLAIN: Final = frozenset({dict, list, str, int, float, bool, bytes, type(None), tuple})


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


def to_plain(payload: Any) -> Any:
    """``payload`` as plain MessagePack values: a dataclass, msgspec.Struct or pydantic model
    instance becomes a map; anything else is returned as it is."""
    if type(payload) in PLAIN:
        return payload
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        if _have("msgspec"):
            import msgspec

            return msgspec.to_builtins(payload, builtin_types=(bytes, bytearray))
        return dataclasses.asdict(payload)
    if hasattr(type(payload), "__struct_fields__"):
        import msgspec

        return msgspec.to_builtins(payload, builtin_types=(bytes, bytearray))
    dump = getattr(payload, "model_dump", None)
    if callable(dump) and not isinstance(payload, type):
        return dump(mode="json")
    return payload


@functools.cache
def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
