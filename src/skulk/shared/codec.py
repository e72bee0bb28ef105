"""Binary and canonical encodings of wire models.

`pack`/`unpack` are the msgpack framing every topic and the event log use; `canonical_bytes`
is the one byte form two nodes compare (and `state_hash` digests), so it must depend only on
field values: sorted keys, no whitespace, UTF-8. Decoding failures of any kind become a
`DecodeError` that names what was being decoded, so callers handle one exception type.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar, get_args, get_origin, overload

import msgpack
from pydantic import BaseModel, TypeAdapter, ValidationError

from skulk.shared.types.base import WireModel

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

MAX_ERRORS_IN_MESSAGE = 3
"""How many pydantic errors a DecodeError message quotes; the rest are counted."""


class DecodeError(ValueError):
    """Bytes or a wire dict that do not decode to the expected model."""

    def __init__(self, target: str, reason: str) -> None:
        super().__init__(f"cannot decode {target}: {reason}")
        self.target = target
        self.reason = reason


def _target_name(target: type[BaseModel] | TypeAdapter[Any]) -> str:
    if not isinstance(target, TypeAdapter):
        return target.__name__
    # A TypeAdapter over `Annotated[Union[...], discriminator]`: name a few members.
    hint = getattr(target, "_type", None)
    members = get_args(get_args(hint)[0]) if get_origin(hint) is Annotated else ()
    names = [getattr(m, "__name__", str(m)) for m in members]
    if not names:
        return str(hint)
    shown = "|".join(names[:3]) + ("|..." if len(names) > 3 else "")
    return f"one of {shown}"


def _explain(err: ValidationError) -> str:
    errors = err.errors(include_url=False)
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
        for e in errors[:MAX_ERRORS_IN_MESSAGE]
    ]
    more = len(errors) - MAX_ERRORS_IN_MESSAGE
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


def pack(model: WireModel) -> bytes:
    """msgpack of the camelCase wire dict."""
    return msgpack.packb(model.to_wire(), use_bin_type=True)


@overload
def from_wire(target: type[M], obj: Any) -> M: ...
@overload
def from_wire(target: TypeAdapter[T], obj: Any) -> T: ...
def from_wire(target: type[BaseModel] | TypeAdapter[Any], obj: Any) -> Any:
    """Validate an already-parsed wire value (dict from msgpack or JSON) into `target`,
    a model class or a `TypeAdapter` over a tagged union."""
    try:
        if isinstance(target, TypeAdapter):
            return target.validate_python(obj)
        return target.model_validate(obj)
    except ValidationError as err:
        raise DecodeError(_target_name(target), _explain(err)) from err


@overload
def unpack(target: type[M], data: bytes) -> M: ...
@overload
def unpack(target: TypeAdapter[T], data: bytes) -> T: ...
def unpack(target: type[BaseModel] | TypeAdapter[Any], data: bytes) -> Any:
    """Decode msgpack bytes into `target` (a model class or a `TypeAdapter`)."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as err:  # msgpack raises several unrelated types for bad input
        raise DecodeError(
            _target_name(target), f"malformed msgpack ({type(err).__name__}: {err})"
        ) from err
    return from_wire(target, obj)


def round_trip(model: M) -> M:
    """pack then unpack as the model's own class: what a peer would receive."""
    return unpack(type(model), pack(model))  # type: ignore[arg-type]


def canonical_bytes(model: WireModel) -> bytes:
    """Deterministic bytes of a model: equal values give equal bytes on every node."""
    return json.dumps(
        model.to_wire(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()


__all__ = ["DecodeError", "canonical_bytes", "from_wire", "pack", "round_trip", "unpack"]
