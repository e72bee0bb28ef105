"""The lifecycle of one direction of a capability call, as pure decisions.

A direction is `started` (seq 0), then ordered chunks (seq 1..n), then exactly one terminal
(`completed`, `failed` or `cancelled`, seq n+1). The sender numbers its frames with
`Outbound`; the receiver puts arriving frames back in order with `receive` (a duplicate is
dropped, a frame ahead of a gap is held, a gap that does not close within `GAP_EXPIRY_S`
or holds more than `MAX_HELD_FRAMES` ends the direction) and checks the order of kinds.
`check_chunk` decides whether a value a handler yielded may go out as a chunk.

No clock, no I/O: the shells (`service.py`, `client.py`) pass `now` in and act on the result.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from skulk.extensions.providers.bounds import GAP_EXPIRY_S, MAX_HELD_FRAMES
from skulk.extensions.providers.errors import CapabilityError
from skulk.shared.types.providers import MAX_ERROR_MESSAGE_CHARS, Direction, FrameKind, ProviderFrame


@dataclass(frozen=True)
class Outbound:
    """The sending side of one direction: the next seq, and whether a terminal went out."""

    call_id: str
    direction: Direction
    next_seq: int = 0
    ended: bool = False


class LifecycleMisuse(RuntimeError):
    """Skulk's own code tried to send a frame the lifecycle forbids (a bug, never a provider's)."""


def emit(
    out: Outbound, kind: FrameKind, payload: Any = None, *, error_kind: str | None = None, message: str | None = None
) -> tuple[Outbound, ProviderFrame]:
    """The next frame of `out`, or LifecycleMisuse when the lifecycle forbids it."""
    if out.ended:
        raise LifecycleMisuse(f"call {out.call_id} {out.direction}: {kind} after the terminal")
    # seq 0 is started, or a lone terminal (a refusal: the call never started)
    if (kind == "started" and out.next_seq != 0) or (kind == "chunk" and out.next_seq == 0):
        raise LifecycleMisuse(f"call {out.call_id} {out.direction}: {kind} at seq {out.next_seq}")
    frame = ProviderFrame(
        call_id=out.call_id,
        direction=out.direction,
        seq=out.next_seq,
        kind=kind,
        payload=payload,
        error_kind=error_kind,
        message=message[:MAX_ERROR_MESSAGE_CHARS] if message is not None else None,
    )
    return replace(out, next_seq=out.next_seq + 1, ended=frame.terminal), frame


@dataclass(frozen=True)
class Inbound:
    """The receiving side of one direction."""

    next_seq: int = 0
    held: tuple[ProviderFrame, ...] = ()
    """Frames ahead of a gap, ordered by seq."""
    gap_since: float | None = None
    ended: bool = False


@dataclass(frozen=True)
class Received:
    view: Inbound
    deliver: tuple[ProviderFrame, ...] = ()
    """Frames now in order, to hand on; the last one may be the terminal."""
    violation: str | None = None
    """The direction is broken: end it `protocol_violation` with this reason."""


def _kind_violation(frame: ProviderFrame) -> str | None:
    if frame.seq == 0 and frame.kind != "started" and not frame.terminal:
        return f"seq 0 is {frame.kind}, expected started"
    if frame.seq > 0 and frame.kind == "started":
        return f"started again at seq {frame.seq}"
    return None


def receive(view: Inbound, frame: ProviderFrame, now: float) -> Received:
    """Take one arriving frame. A refusal may come as a lone terminal at seq 0 (no started)."""
    if view.ended or frame.seq < view.next_seq:
        return Received(view)  # a duplicate, or a straggler after the terminal
    if frame.seq > view.next_seq:
        if any(held.seq == frame.seq for held in view.held):
            return Received(view)
        if len(view.held) >= MAX_HELD_FRAMES:
            return Received(
                replace(view, ended=True),
                violation=f"frame {view.next_seq} missing, {len(view.held)} frames after it held",
            )
        held = tuple(sorted((*view.held, frame), key=lambda f: f.seq))
        return Received(replace(view, held=held, gap_since=view.gap_since if view.gap_since is not None else now))
    ready = [frame]
    rest = list(view.held)
    while rest and rest[0].seq == ready[-1].seq + 1:
        ready.append(rest.pop(0))
    deliver: list[ProviderFrame] = []
    for item in ready:
        problem = _kind_violation(item)
        if problem is not None:
            return Received(replace(view, ended=True, held=()), tuple(deliver), violation=problem)
        deliver.append(item)
        if item.terminal:
            return Received(Inbound(next_seq=item.seq + 1, ended=True), tuple(deliver))
    next_seq = deliver[-1].seq + 1
    return Received(Inbound(next_seq=next_seq, held=tuple(rest), gap_since=now if rest else None), tuple(deliver))


def expired(view: Inbound, now: float, gap_expiry_s: float = GAP_EXPIRY_S) -> str | None:
    """Why the direction must end now (a gap that stayed open too long), or None."""
    if not view.ended and view.gap_since is not None and now - view.gap_since > gap_expiry_s:
        return f"frame {view.next_seq} missing for more than {gap_expiry_s:g} s"
    return None


def as_json(value: Any) -> Any:
    """`value` as plain JSON data (tuples as lists, keys as strings): what goes on the wire.
    Only for a value `check_chunk` accepted."""
    return json.loads(json.dumps(value, allow_nan=False))


def json_size(value: Any) -> int:
    """Bytes of `value` as compact JSON; ValueError/TypeError when it is not JSON."""
    return len(json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode())


def check_chunk(
    value: Any, max_bytes: int, schema_errors: Callable[[Any], str | None], *, what: str = "chunk"
) -> CapabilityError | None:
    """Whether `value` may go out as a chunk (or a unary result): JSON, within `max_bytes`,
    valid for the output schema. Returns the error that ends the call, or None."""
    try:
        size = json_size(value)
    except (TypeError, ValueError) as exc:
        return CapabilityError("malformed_chunk", f"the provider's {what} is not JSON: {exc}")
    if size > max_bytes:
        return CapabilityError("malformed_chunk", f"the provider's {what} is {size} bytes, over the cap of {max_bytes}")
    problem = schema_errors(value)
    if problem is not None:
        return CapabilityError("output_invalid", f"the provider's {what} breaks the output schema: {problem}")
    return None


__all__ = [
    "Inbound",
    "LifecycleMisuse",
    "Outbound",
    "Received",
    "as_json",
    "check_chunk",
    "emit",
    "expired",
    "json_size",
    "receive",
]
