"""What a provider is: the objects an extension's `providers()` returns.

A provider has `descriptors()` (its `CapabilityDescriptor`s) and, for each I/O mode it
serves, a handler found by attribute:

- unary: `handle_call(capability_id, payload, ctx)` returns the result (or an awaitable of it).
- streaming modes: `handle_stream(capability_id, payload, inputs, ctx)` returns an async
  iterator of output chunks. `payload` is the one input value (server-streaming) or None;
  `inputs` is an async iterator of the caller's input chunks (client- and bidirectional
  streaming; it ends at the caller's half-close) or None.
- optional `admit(capability_id, ctx)`: dynamic admission before anything runs; return a
  reason string to refuse (`admission_refused`), None to admit.

Skulk owns the lifecycle: it emits `started`, numbers and checks every chunk against the
output schema and the chunk cap, and sends the terminal only after the handler's iterator
returned and its `finally` ran. A handler that yields a bad chunk has its iterator closed
before the call ends with a synthetic failure. Pure: this module only describes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from skulk.shared.types.providers import CapabilityDescriptor


@dataclass(frozen=True)
class CallContext:
    """What a handler knows about its call."""

    call_id: str
    capability_id: str
    version: str
    caller_node: str
    provider_node: str
    timeout_s: float


@runtime_checkable
class Provider(Protocol):
    def descriptors(self) -> Any: ...


def serves_unary(provider: Any) -> bool:
    return callable(getattr(provider, "handle_call", None))


def serves_streams(provider: Any) -> bool:
    return callable(getattr(provider, "handle_stream", None))


InputStream = AsyncIterator[Any]

__all__ = ["CallContext", "CapabilityDescriptor", "InputStream", "Provider", "serves_streams", "serves_unary"]
