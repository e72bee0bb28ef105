"""Every bound and deadline of capability calls, named and documented once."""

from __future__ import annotations

from typing import Final

KIB: Final = 1024
MIB: Final = 1024 * KIB

DEFAULT_CALL_TIMEOUT_S: Final = 30.0
"""A call's deadline when the caller names none: the provider's handler is cancelled (its
iterator closed) and the call ends `deadline_exceeded` when it passes."""

MAX_CALL_TIMEOUT_S: Final = 600.0
"""The longest deadline a caller may ask for (a long transcription, a generated clip)."""

DEADLINE_GRACE_S: Final = 2.0
"""How much longer than the call's deadline the caller waits for the provider's own
`deadline_exceeded` before ending the call itself (the frame's trip between nodes)."""

OPEN_TIMEOUT_S: Final = 5.0
"""How long the caller waits for the provider node's first answer to an open (its `started`
or refusal) before the call ends `node_unreachable`: a node that is gone never answers."""

DESCRIBE_TIMEOUT_S: Final = 3.0
"""How long `GET /v1/capabilities` waits for one node's descriptors; a node that does not
answer is reported as unreachable, never fatal to the listing."""

MAX_INPUT_BYTES: Final = 1 * MIB
"""Largest input value of one call (unary and server-streaming), as compact JSON."""

MAX_OUTPUT_BYTES: Final = 1 * MIB
"""Largest result of one unary call, as compact JSON."""

MAX_CHUNK_BYTES: Final = 1 * MIB
"""Largest chunk of a stream, in either direction, as compact JSON. Bigger media travels as
several chunks; the `provider_data` topic's bound is this plus framing."""

MAX_CONCURRENT_CALLS: Final = 32
"""Calls one provider node serves at once, all capabilities together; past it an open is
refused `overloaded` (a retry a little later is the fix)."""

MAX_PENDING_OPENS: Final = 64
"""Calls one caller node has opened and not yet seen started or refused."""

CALL_QUEUE_FRAMES: Final = 64
"""Frames one call buffers per direction for a reader that has not taken them. Each call has
its own queue: a slow reader fills only its own, and when it is full that one call ends
`overloaded` (the other calls on the node never wait for it)."""

MAX_HELD_FRAMES: Final = 32
"""Out-of-order frames one direction holds while waiting for a missing one; past it the
direction ends `protocol_violation`."""

GAP_EXPIRY_S: Final = 5.0
"""How long a direction waits for a missing frame before it ends `protocol_violation`."""

MAX_DESCRIPTORS_PER_NODE: Final = 64
"""Capabilities one node may register."""

MAX_DESCRIPTOR_BYTES: Final = 48 * KIB
"""Largest descriptor (schemas included) as compact JSON. With MAX_DESCRIPTORS_PER_NODE it
keeps a node's whole describe answer under the `provider_calls` topic's 4 MiB bound."""

SHUTDOWN_WAIT_S: Final = 1.0
"""How long a stopping node waits for its running handlers to close (their `finally`) and
its last answers to leave; inside the node's own subsystem stop budget (`node.SUBSYSTEM_STOP_S`)."""
