"""The wire vocabulary of capability providers: descriptors, and the messages of a call.

A provider (an extension, `skulk.extensions.providers`) serves capabilities described by
`CapabilityDescriptor`s. A call is node-addressed and direct between the caller's node and
the provider's node: the master, State and the event log are never in its path.

Two topics carry it (`skulk.routing.topics`):

- `provider_calls` (control, node-addressed): `DescribeCapabilities` and its answer
  `CapabilitiesDescribed`, `OpenCall` (admission happens on it) and `CancelCall`.
- `provider_data` (data, node-addressed): `ProviderFrame`s in both directions. Each active
  direction of a call is one ordered stream: `started` (seq 0), chunks (seq 1..n), then
  exactly one terminal (`completed`, `failed` or `cancelled`). The caller's input
  direction (client- and bidirectional streaming) ends with the caller's half-close.

This module only describes; the lifecycle rules are `skulk.extensions.providers.lifecycle`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, TypeAdapter

from skulk.shared.types.base import WireModel

IoMode = Literal["unary", "server_streaming", "client_streaming", "bidi_streaming"]
IO_MODES: tuple[IoMode, ...] = ("unary", "server_streaming", "client_streaming", "bidi_streaming")
STREAMING_INPUT_MODES: frozenset[IoMode] = frozenset({"client_streaming", "bidi_streaming"})
"""Modes whose input is a stream of chunks (the caller gets an input sink) rather than one value."""

FrameKind = Literal["started", "chunk", "completed", "failed", "cancelled"]
TERMINAL_FRAME_KINDS: frozenset[FrameKind] = frozenset({"completed", "failed", "cancelled"})
Direction = Literal["input", "output"]
MAX_ERROR_MESSAGE_CHARS = 2048
"""A terminal frame's `message` is cut to this (the sender cuts it; a provider's exception
text is not bounded)."""

CAPABILITY_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
SEMVER_PATTERN = r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$"


class CapabilityDescriptor(WireModel):
    """One capability a provider serves: what a caller that never heard of it needs.

    `input_schema` describes the call's input (unary and server-streaming: the one input value;
    client- and bidirectional streaming: each input chunk); `output_schema` describes the
    result (unary) or each output chunk (streaming modes)."""

    id: str = Field(pattern=CAPABILITY_ID_PATTERN)
    version: str = Field(pattern=SEMVER_PATTERN)
    description: str = Field(max_length=4096)
    io_mode: IoMode
    input_schema: dict[str, JsonValue]
    output_schema: dict[str, JsonValue]

    @property
    def tag(self) -> str:
        """`id@version`: the node tag that advertises it."""
        return f"{self.id}@{self.version}"

    @property
    def revision(self) -> str:
        """sha256 of the canonical descriptor JSON: a caller pins the exact descriptor it read."""
        canonical = json.dumps(self.to_wire(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def listing(self) -> dict[str, Any]:
        """The descriptor as `GET /v1/capabilities` shows it: its wire form and its revision."""
        return {**self.to_wire(), "revision": self.revision}


class DescribeCapabilities(WireModel):
    """Caller -> provider node: send me your descriptors (answered to the sender)."""

    type: Literal["DescribeCapabilities"] = "DescribeCapabilities"
    request_id: str = Field(min_length=1, max_length=64)


class CapabilitiesDescribed(WireModel):
    type: Literal["CapabilitiesDescribed"] = "CapabilitiesDescribed"
    request_id: str = Field(min_length=1, max_length=64)
    descriptors: tuple[CapabilityDescriptor, ...] = ()


class OpenCall(WireModel):
    """Caller -> provider node: admit and start one call, pinned to `revision`.

    `input` is the call's one input value for unary and server-streaming calls (None for the
    streaming-input modes, whose chunks follow on `provider_data` once the call started).
    `io_modes` are the modes the caller can drive (the HTTP route drives no input stream): a
    capability of another mode is refused `mode_unsupported` before it runs. The provider's
    `started` frame carries `{"ioMode": ...}` as its payload."""

    type: Literal["OpenCall"] = "OpenCall"
    call_id: str = Field(min_length=1, max_length=64)
    capability_id: str = Field(max_length=64)
    version: str = Field(max_length=64)
    revision: str = Field(max_length=64)
    io_modes: tuple[IoMode, ...] = IO_MODES
    input: JsonValue = None
    timeout_s: float = Field(gt=0)


class CancelCall(WireModel):
    """Caller -> provider node: the caller abandoned the call (client left, deadline passed)."""

    type: Literal["CancelCall"] = "CancelCall"
    call_id: str = Field(min_length=1, max_length=64)
    reason: str = Field(default="", max_length=512)


ProviderCallMessage = Annotated[
    DescribeCapabilities | CapabilitiesDescribed | OpenCall | CancelCall, Field(discriminator="type")
]
PROVIDER_CALL_ADAPTER: TypeAdapter[ProviderCallMessage] = TypeAdapter(ProviderCallMessage)


class ProviderFrame(WireModel):
    """One frame of one direction of a call. `payload` is a chunk's value (chunks only);
    `error_kind` and `message` explain a `failed` or `cancelled` terminal."""

    type: Literal["ProviderFrame"] = "ProviderFrame"
    call_id: str = Field(min_length=1, max_length=64)
    direction: Direction
    seq: int = Field(ge=0)
    kind: FrameKind
    payload: JsonValue = None
    error_kind: str | None = Field(default=None, max_length=64)
    message: str | None = Field(default=None, max_length=MAX_ERROR_MESSAGE_CHARS)

    @property
    def terminal(self) -> bool:
        return self.kind in TERMINAL_FRAME_KINDS


__all__ = [
    "CAPABILITY_ID_PATTERN",
    "IO_MODES",
    "MAX_ERROR_MESSAGE_CHARS",
    "PROVIDER_CALL_ADAPTER",
    "SEMVER_PATTERN",
    "STREAMING_INPUT_MODES",
    "TERMINAL_FRAME_KINDS",
    "CancelCall",
    "CapabilitiesDescribed",
    "CapabilityDescriptor",
    "DescribeCapabilities",
    "Direction",
    "FrameKind",
    "IoMode",
    "OpenCall",
    "ProviderCallMessage",
    "ProviderFrame",
]
