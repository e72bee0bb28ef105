"""Follower ordering and master-side replay pacing, as pure data in / data out.

`FollowerBuffer` turns indexed events arriving in any order (live broadcast, replay bursts,
duplicates) into the exact contiguous run the reducer may apply next, and says when to ask
the master for a replay. `ReplayScheduler` is the master's side: it coalesces replay
requests per node and hands out paced bursts of at most REPLAY_BURST_EVENTS events, at most
one burst per node per REPLAY_BURST_INTERVAL_S, so a joining node's retained tail can
neither monopolise the master nor overflow a slow follower.

This module never reads the clock (`now` is passed in, in seconds), never does I/O and never
mutates its inputs: every function returns a new value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from skulk.shared.types.events import IndexedEvent

MAX_BUFFERED_EVENTS: Final = 4096
"""A follower never holds more out-of-order events than this. Beyond it the highest-index
pending events are dropped (and counted): they come again through the replay that the open
gap keeps asking for, lowest first, so dropping the highest loses no progress."""

REPLAY_BURST_EVENTS: Final = 32
"""Events per replay burst: what a slow follower is presented with at once."""

REPLAY_BURST_INTERVAL_S: Final = 0.25
"""Minimum time between two bursts to the same node (the seed's paced cadence)."""

TAIL_LAG_S: Final = 1.5
"""How long a follower may trail its master's announced high-water mark, with no gap open,
before it asks for the tail: longer than an event takes to follow the announcement that
overtook it (they travel on different topics), shorter than two announcements apart."""

GAP_REQUEST_RETRY_S: Final = 2.0
"""A follower sends at most one replay request per this period; while a gap stays open it
re-asks after it (the first request, or its replay, may have been lost)."""

MAX_REPLAY_NODES: Final = 256
"""Nodes the master tracks replay requests for. Beyond it the least recently requesting
node is forgotten (counted in `dropped_requests`); that follower re-asks after
GAP_REQUEST_RETRY_S."""


# -- follower side ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FollowerBuffer:
    """What a follower holds between the applied prefix and the live edge.

    `next_idx` is the index the reducer needs next; `pending` the events already received
    beyond it (all > next_idx, at most MAX_BUFFERED_EVENTS). `requested_since` is the
    `since_idx` of the replay request made for the gap now open (None when none is open or
    none has been sent for it yet); `requested_at` the time of the most recent request,
    kept across gaps because requests are rate-limited. `dropped` counts events discarded
    at the buffer bound (for diagnostics).
    """

    next_idx: int
    pending: Mapping[int, IndexedEvent] = field(default_factory=dict[int, IndexedEvent])
    requested_since: int | None = None
    requested_at: float | None = None
    dropped: int = 0
    behind_since: float | None = None
    """When the master's announced high-water mark was first seen beyond `next_idx` with no
    gap open (None: not behind, or not known to be)."""

    @property
    def gap_open(self) -> bool:
        """True while events beyond `next_idx` are held but `next_idx` itself is missing."""
        return bool(self.pending)


def follower_buffer(next_idx: int) -> FollowerBuffer:
    """An empty buffer whose reducer next needs event `next_idx`."""
    if next_idx < 0:
        raise ValueError(f"next_idx must be >= 0, got {next_idx}")
    return FollowerBuffer(next_idx=next_idx)


def receive(
    buf: FollowerBuffer, event: IndexedEvent, now: float
) -> tuple[FollowerBuffer, list[IndexedEvent], int | None]:
    """Take one indexed event.

    Returns the new buffer, the events now applicable in order (contiguous from the old
    `next_idx`; apply them all, in this order), and a `since_idx` to request a replay from,
    or None. Old or duplicate events change nothing.
    """
    if event.idx < buf.next_idx or event.idx in buf.pending:
        return buf, [], None
    if event.idx == buf.next_idx and not buf.pending:
        # The common case, live and in order: no copy of the pending map.
        return dataclasses.replace(buf, next_idx=event.idx + 1, requested_since=None), [event], None
    buf, ready = _release(dataclasses.replace(buf, pending={**buf.pending, event.idx: event}))
    if len(buf.pending) > MAX_BUFFERED_EVENTS:
        pending = dict(buf.pending)
        del pending[max(pending)]
        buf = dataclasses.replace(buf, pending=pending, dropped=buf.dropped + 1)
    buf, since = _maybe_request(buf, now)
    return buf, ready, since


def drain(buf: FollowerBuffer) -> tuple[FollowerBuffer, list[IndexedEvent]]:
    """Release the run already held at `next_idx`, if any. Call it after `reset`: a snapshot
    can land exactly below events that were already buffered."""
    return _release(buf)


def on_tick(buf: FollowerBuffer, now: float) -> tuple[FollowerBuffer, int | None]:
    """Re-ask for a replay when a gap is still open GAP_REQUEST_RETRY_S after the last ask."""
    return _maybe_request(buf, now)


def on_master_high_water(buf: FollowerBuffer, high_water_idx: int, now: float) -> tuple[FollowerBuffer, int | None]:
    """Take the master's announced last index. A follower behind it with no gap open missed
    the tail of a burst (no later event will reveal that gap in a quiet cluster): once that
    has lasted TAIL_LAG_S it asks for a replay from `next_idx`, rate-limited like a gap."""
    if high_water_idx < buf.next_idx:
        return (buf if buf.behind_since is None else dataclasses.replace(buf, behind_since=None)), None
    if buf.gap_open:
        return buf, None  # the gap's own requests cover it
    if buf.behind_since is None:
        return dataclasses.replace(buf, behind_since=now), None
    if now - buf.behind_since < TAIL_LAG_S:
        return buf, None
    if buf.requested_at is not None and now - buf.requested_at < GAP_REQUEST_RETRY_S:
        return buf, None
    return dataclasses.replace(buf, requested_at=now), buf.next_idx


def follower_needs_ticks(master_known: bool, i_am_master: bool, synced: bool, buf: FollowerBuffer) -> bool:
    """Whether a replica has timed work (`on_tick`, or re-asking for its snapshot): it follows
    a known master and still waits for its snapshot, holds events beyond a gap, or trails the
    master's announced high-water mark. Otherwise the shell's ticker sleeps until a message
    or a new session: an idle node does not wake for nothing."""
    return master_known and not i_am_master and (not synced or buf.gap_open or buf.behind_since is not None)


def reset(buf: FollowerBuffer, next_idx: int) -> FollowerBuffer:
    """After adopting a snapshot whose high-water index is `next_idx - 1`: the reducer now
    needs `next_idx`; pending events below it are covered by the snapshot, later ones kept.
    Follow with `drain` to release any run that starts exactly at `next_idx`."""
    if next_idx < 0:
        raise ValueError(f"next_idx must be >= 0, got {next_idx}")
    pending = {i: e for i, e in buf.pending.items() if i >= next_idx}
    requested_since = None
    if pending and buf.requested_since is not None:
        requested_since = max(buf.requested_since, next_idx)
    return dataclasses.replace(buf, next_idx=next_idx, pending=pending, requested_since=requested_since)


def _release(buf: FollowerBuffer) -> tuple[FollowerBuffer, list[IndexedEvent]]:
    if buf.next_idx not in buf.pending:
        return buf, []
    pending = dict(buf.pending)
    ready: list[IndexedEvent] = []
    idx = buf.next_idx
    while idx in pending:
        ready.append(pending.pop(idx))
        idx += 1
    requested_since = buf.requested_since if pending else None  # gap closed: request done
    return dataclasses.replace(buf, next_idx=idx, pending=pending, requested_since=requested_since), ready


def _maybe_request(buf: FollowerBuffer, now: float) -> tuple[FollowerBuffer, int | None]:
    if not buf.gap_open:
        return buf, None
    if buf.requested_at is not None and now - buf.requested_at < GAP_REQUEST_RETRY_S:
        return buf, None
    return dataclasses.replace(buf, requested_since=buf.next_idx, requested_at=now), buf.next_idx


# -- master side -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayScheduler:
    """The master's open replay requests and per-node pacing.

    `wanted` maps a node to the next index to send it (its open request), in the order
    requests arrived (oldest first; the bound drops from the front). `last_burst_at` is when
    each node was last sent a burst; it outlives a completed request for one interval so a
    fresh request cannot beat the pacing. `dropped_requests` counts requests forgotten at
    MAX_REPLAY_NODES.
    """

    wanted: Mapping[str, int] = field(default_factory=dict[str, int])
    last_burst_at: Mapping[str, float] = field(default_factory=dict[str, float])
    dropped_requests: int = 0

    @property
    def open_requests(self) -> int:
        return len(self.wanted)


def replay_scheduler() -> ReplayScheduler:
    """A scheduler with no open requests."""
    return ReplayScheduler()


def request(sched: ReplayScheduler, node_id: str, since_idx: int) -> ReplayScheduler:
    """Ask for every event from `since_idx` on to be replayed to `node_id`.

    Coalesces: a node with an open request keeps the lower of the two starts (a re-ask from
    earlier means the follower lost part of what was sent, so the cursor rewinds).
    """
    if since_idx < 0:
        raise ValueError(f"since_idx must be >= 0, got {since_idx}")
    wanted = dict(sched.wanted)
    start = min(wanted.pop(node_id), since_idx) if node_id in wanted else since_idx
    wanted[node_id] = start  # (re)inserted at the end: the most recent requester
    dropped = sched.dropped_requests
    while len(wanted) > MAX_REPLAY_NODES:
        del wanted[next(iter(wanted))]
        dropped += 1
    return dataclasses.replace(sched, wanted=wanted, dropped_requests=dropped)


def due_bursts(
    sched: ReplayScheduler, now: float, last_available_idx: int
) -> tuple[ReplayScheduler, list[tuple[str, int, int]]]:
    """The bursts to send now: `(node_id, start_idx, end_idx_exclusive)`, at most
    REPLAY_BURST_EVENTS events each, at most one per node per REPLAY_BURST_INTERVAL_S, in
    request order. A request completes once it has been sent up to `last_available_idx`
    (the master's highest index; -1 when the log is empty). The shell sends events with
    index in [start, end) and must itself answer a start below its retained tail with a
    snapshot instead."""
    wanted = dict(sched.wanted)
    last_burst_at = {
        node: at
        for node, at in sched.last_burst_at.items()
        if node in wanted or now - at < REPLAY_BURST_INTERVAL_S  # pacing memory, bounded
    }
    bursts: list[tuple[str, int, int]] = []
    for node, start in sched.wanted.items():
        last = last_burst_at.get(node)
        if last is not None and now - last < REPLAY_BURST_INTERVAL_S:
            continue
        if start > last_available_idx:
            del wanted[node]  # already sent everything there is
            continue
        end = min(start + REPLAY_BURST_EVENTS, last_available_idx + 1)
        bursts.append((node, start, end))
        last_burst_at[node] = now
        if end > last_available_idx:
            del wanted[node]
        else:
            wanted[node] = end
    return dataclasses.replace(sched, wanted=wanted, last_burst_at=last_burst_at), bursts


def next_due_at(sched: ReplayScheduler, now: float) -> float | None:
    """When `due_bursts` next has something to send (never before `now`), None when no
    request is open: what the shell's replay worker sleeps until."""
    if not sched.wanted:
        return None
    earliest = min(
        sched.last_burst_at[n] + REPLAY_BURST_INTERVAL_S if n in sched.last_burst_at else now for n in sched.wanted
    )
    return max(now, earliest)


__all__ = [
    "GAP_REQUEST_RETRY_S",
    "MAX_BUFFERED_EVENTS",
    "MAX_REPLAY_NODES",
    "REPLAY_BURST_EVENTS",
    "REPLAY_BURST_INTERVAL_S",
    "TAIL_LAG_S",
    "FollowerBuffer",
    "ReplayScheduler",
    "drain",
    "due_bursts",
    "follower_buffer",
    "follower_needs_ticks",
    "next_due_at",
    "on_master_high_water",
    "on_tick",
    "receive",
    "replay_scheduler",
    "request",
    "reset",
]
