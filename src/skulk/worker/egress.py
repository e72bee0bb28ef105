"""Which output frame the worker's bounded send queue (to remote owning APIs) admits.

A stream is only ever failed cleanly by its owning API when the frame that goes missing is
not its last: a dropped payload leaves a gap the API's lifecycle check turns into a typed
`protocol_violation` at the next frame, but a dropped terminal leaves nothing behind it, and
the stream would wait for its idle lease. So terminals get room payloads cannot take: the
queue's last TERMINAL_RESERVE places. (The owning API also ends a stream whose task State
shows Complete if the terminal still never arrives: `skulk.api.streams.TERMINAL_GRACE_S`.)

Pure: a frame and the queue's depth in, yes or no out.
"""

from __future__ import annotations

from skulk.shared.types.chunks import DataFrame, StreamTerminal

EGRESS_CAPACITY = 4096
"""Frames waiting to go to remote owning APIs that are not terminals; beyond it a payload is
dropped and counted (its owning API then fails that stream on its lifecycle check)."""

TERMINAL_RESERVE = 256
"""Places beyond EGRESS_CAPACITY that only terminals may take: one per concurrent stream an
API node admits (`skulk.api.streams.MAX_OPEN_STREAMS`), so a flood of payloads never costs a
stream its end. The queue's hard bound is the sum."""

EGRESS_BOUND = EGRESS_CAPACITY + TERMINAL_RESERVE


def egress_admits(frame: DataFrame, depth: int) -> bool:
    """May `frame` join a send queue already holding `depth` frames?"""
    return depth < (EGRESS_BOUND if isinstance(frame, StreamTerminal) else EGRESS_CAPACITY)


__all__ = ["EGRESS_BOUND", "EGRESS_CAPACITY", "TERMINAL_RESERVE", "egress_admits"]
