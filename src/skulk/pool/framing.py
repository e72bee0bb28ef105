"""Where ggml RPC messages end, so the pool channel seals one frame per message burst.

ggml's RPC client writes each command as three `send` calls (its command byte, its 8-byte
payload size, the payload) on a TCP_NODELAY socket, and its server each answer as two (size,
payload). A relay that sealed whatever one `recv` returned sent up to three frames per
command, each paying a seal, an open and a thread hand-off at both ends of the channel
(measured on the bench model: 9.5 frames a token towards the donor, 113 of 609 of them one
byte long). Knowing where a message ends lets the relay wait for the rest of a message that
is still arriving (its sender is mid-`send`) and seal the whole burst once.

A burst is longer than one message: at the start of a token the driver sets its inputs on
the donor (several SET_TENSOR commands, no answer), then computes its own layers, then sends
the activations (SET_TENSOR), the graph (GRAPH_RECOMPUTE) and the request for the logits
(GET_TENSOR). A command that only stores data (`DATA_ONLY`) is never acted on before a later
command arrives, so after one the relay waits a little for the next (`lingers`) instead of
sealing at once; after any command that computes or is answered it seals at once.

This is a flush policy only: bytes are relayed unchanged and in order whatever it decides,
and the relay bounds every wait (`BURST_WAIT_S` in `channel`), so a message it misreads
costs that wait, never a hang or a changed byte.

    request  (driver -> donor): | command: u8 | size: u64 LE | payload: size bytes |
    response (donor -> driver): | size: u64 LE | payload: size bytes |
"""

from __future__ import annotations

from dataclasses import dataclass

SIZE_BYTES = 8


@dataclass(frozen=True)
class Framing:
    """One direction's message layout: where the payload size sits in the header."""

    size_at: int
    command_at: int | None = None
    """Where the command byte sits (requests only)."""

    @property
    def header_bytes(self) -> int:
        return self.size_at + SIZE_BYTES


REQUESTS = Framing(size_at=1, command_at=0)
"""What llama.cpp's RPC client sends: a command byte, then the size."""
RESPONSES = Framing(size_at=0)
"""What ggml's RPC server answers: the size first."""


DATA_ONLY = frozenset({4, 5, 6, 12, 17})
"""ggml RPC (protocol 7) commands that store or free data, are not answered and compute
nothing: FREE_BUFFER, BUFFER_CLEAR, SET_TENSOR, INIT_TENSOR, MEMSET_TENSOR."""


@dataclass(frozen=True)
class Cursor:
    """Where a byte stream stands: inside a header (`header` holds its bytes so far) or
    inside a payload (`payload_left` bytes still to come). A fresh Cursor is between
    messages."""

    header: bytes = b""
    payload_left: int = 0
    command: int | None = None
    """The command of the message the cursor is in, or last finished (requests only)."""

    @property
    def between_messages(self) -> bool:
        return not self.header and self.payload_left == 0


BETWEEN = Cursor()


def advance(framing: Framing, cursor: Cursor, data: bytes | memoryview) -> Cursor:
    """The cursor after `data` more bytes of the stream."""
    header, left, command = cursor.header, cursor.payload_left, cursor.command
    at, end = 0, len(data)
    while at < end:
        if left:
            step = min(left, end - at)
            left -= step
            at += step
            continue
        take = min(framing.header_bytes - len(header), end - at)
        header += bytes(data[at : at + take])
        at += take
        if len(header) == framing.header_bytes:
            left = int.from_bytes(header[framing.size_at :], "little")
            command = header[framing.command_at] if framing.command_at is not None else None
            header = b""
    return Cursor(header, left, command)


def lingers(cursor: Cursor) -> bool:
    """Between messages, right after a data-only command: more of the burst is coming."""
    return cursor.between_messages and cursor.command in DATA_ONLY


__all__ = ["BETWEEN", "DATA_ONLY", "REQUESTS", "RESPONSES", "SIZE_BYTES", "Cursor", "Framing", "advance", "lingers"]
