"""The master's indexer: turns producers' LocalEvents into the one ordered cluster log.

Pure data in, data out. `admit` takes one LocalEvent a producer published on LOCAL_EVENTS
and returns the IndexedEvents it releases; `index_own` indexes the master's own decisions.
Per producer stream, keyed by (origin, origin_session) since a restarted producer is a new
session whose sequence starts again:

- the first LocalEvent seen for a stream sets the expected sequence (a new master joins
  streams mid-flight), unless `resume_indexer` left a floor for it from the log;
- a sequence below the expected one is a duplicate: counted and dropped;
- a sequence above it is held until the run is contiguous, at most
  `MAX_PENDING_PER_ORIGIN` per stream (at the bound the highest is dropped and counted);
- a gap that stays open for `MAX_GAP_WAIT_S` is presumed lost (the control plane's receive
  queue drops the newest when full) and skipped, counted in `gaps_skipped`, so one lost
  packet never stalls a producer forever;
- every released event advances the stream's expected sequence, but only events in the
  `PRODUCER_EVENT_TYPES` allowlist consume an index. Telemetry that still decodes as an
  event (`DownloadOngoing`) is skipped at its source sequence; master-only decisions
  (InstanceCreated, NodeTimedOut, TaskCreated, ...) are rejected and counted by type, so a
  misbehaving or malicious peer can never forge a placement or a prune.

This module must never do I/O, read a clock or mint ids: `now` is passed in, and the shell
persists, publishes and applies what comes out, in the order given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from skulk.shared.types.events import (
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    Event,
    IndexedEvent,
    InstancePlacementRefused,
    LocalEvent,
    NodeJoined,
    NodeLeft,
    NodeNetworkUpdated,
    RunnerDeleted,
    RunnerStatusUpdated,
    TaskAcknowledged,
    TaskStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from skulk.shared.types.ids import NodeId, SessionId

PRODUCER_EVENT_TYPES: frozenset[type] = frozenset(
    {
        NodeJoined,
        NodeLeft,
        NodeNetworkUpdated,
        TopologyEdgeCreated,
        TopologyEdgeDeleted,
        RunnerStatusUpdated,
        RunnerDeleted,
        TaskAcknowledged,
        TaskStatusUpdated,
        DownloadPending,
        DownloadCompleted,
        DownloadFailed,
        InstancePlacementRefused,
    }
)
"""Event types a non-master producer may submit: ordered connectivity facts and the durable
outcomes of work the master assigned. Everything else is a master-only decision."""

SKIPPED_EVENT_TYPES: frozenset[type] = frozenset({DownloadOngoing})
"""Decodable but observational: consumes its source sequence, never an index."""

MAX_PENDING_PER_ORIGIN = 1024
"""Out-of-order events held per (origin, session) stream while waiting for a gap to fill:
the control plane's receive-queue capacity, so one full queue of reordering fits."""

MAX_GAP_WAIT_S = 5.0
"""How long a held stream waits for a missing sequence before presuming it lost. The
control plane is reliable and ordered per publisher, so a gap open this long means a
receive queue dropped it; waiting longer only delays everything queued behind it."""

MAX_SESSIONS_PER_ORIGIN = 4
"""Producer sessions remembered per origin; a restarted producer starts a new session, so
older ones are only kept to recognise a few late duplicates. Oldest first-seen goes first."""

MAX_TRACKED_STREAMS = 4096
"""Bound on (origin, session) streams across all origins (a killed node returns with a new
identity, so origins accumulate). Oldest first-seen is forgotten first, counted."""

StreamKey = tuple[NodeId, SessionId]


@dataclass(frozen=True)
class Indexer:
    """Everything the indexer remembers. Treat the mappings as read-only; every operation
    returns a successor built from fresh dicts.

    `expected` is insertion-ordered by first sight of a stream (the eviction order).
    `floors` holds the lowest acceptable sequence for streams known only from the log
    (see `resume_indexer`); the first live event above the floor sets `expected`.
    `gap_since` is when each stream with held events started waiting for its current gap.
    """

    next_idx: int
    expected: Mapping[StreamKey, int] = field(default_factory=dict[StreamKey, int])
    pending: Mapping[StreamKey, Mapping[int, LocalEvent]] = field(default_factory=dict[StreamKey, Mapping[int, LocalEvent]])
    gap_since: Mapping[StreamKey, datetime] = field(default_factory=dict[StreamKey, datetime])
    floors: Mapping[StreamKey, int] = field(default_factory=dict[StreamKey, int])
    duplicates: int = 0
    skipped: int = 0
    rejected: int = 0
    overflow: int = 0
    gaps_skipped: int = 0
    streams_evicted: int = 0
    rejected_types: Mapping[str, int] = field(default_factory=dict[str, int])

    def pending_depth(self) -> int:
        return sum(len(held) for held in self.pending.values())

    def stats(self) -> dict[str, int]:
        """Counters and depths for /v1/diagnostics/node."""
        return {
            "next_idx": self.next_idx,
            "streams": len(self.expected),
            "pending": self.pending_depth(),
            "pending_capacity_per_stream": MAX_PENDING_PER_ORIGIN,
            "duplicates": self.duplicates,
            "skipped": self.skipped,
            "rejected": self.rejected,
            "overflow": self.overflow,
            "gaps_skipped": self.gaps_skipped,
            "streams_evicted": self.streams_evicted,
        }


def new_indexer(next_idx: int) -> Indexer:
    """A fresh indexer whose first index is `next_idx` (the log's high water + 1)."""
    if next_idx < 0:
        raise ValueError(f"next_idx must be >= 0, got {next_idx}")
    return Indexer(next_idx=next_idx)


def resume_indexer(next_idx: int, history: Iterable[IndexedEvent]) -> Indexer:
    """A new master's indexer, with a dedup floor per producer stream rebuilt from the
    `origin_session`/`origin_seq` of already-indexed events (say, the log's retained tail),
    so a producer re-publishing what the old master already indexed is not indexed twice.
    A floor is not an expected sequence: skipped events leave no trace in the log, so the
    first live event above the floor starts the stream instead of waiting for a gap."""
    floors: dict[StreamKey, int] = {}
    for indexed in history:
        if indexed.origin_session is None or indexed.origin_seq is None:
            continue
        key = (indexed.origin, indexed.origin_session)
        floors[key] = max(floors.get(key, 0), indexed.origin_seq + 1)
    ix = new_indexer(next_idx)
    return replace(ix, floors=_bounded_floors(floors))


def _bounded_floors(floors: dict[StreamKey, int]) -> dict[StreamKey, int]:
    keys = list(floors)[-MAX_TRACKED_STREAMS:]
    return {k: floors[k] for k in keys}


# -- helpers --------------------------------------------------------------------------------


def _indexed(ix: Indexer, local: LocalEvent, now: datetime) -> IndexedEvent:
    return IndexedEvent(
        idx=ix.next_idx,
        origin=local.origin,
        indexed_at=now,
        event=local.event,
        origin_session=local.origin_session,
        origin_seq=local.origin_seq,
    )


def _count(counts: Mapping[str, int], name: str) -> dict[str, int]:
    return {**counts, name: counts.get(name, 0) + 1}


def _release_one(ix: Indexer, local: LocalEvent, now: datetime) -> tuple[Indexer, IndexedEvent | None]:
    """Order one in-sequence event: index it, skip it, or reject it. The caller advances
    the stream's expected sequence either way."""
    kind = type(local.event)
    if kind in PRODUCER_EVENT_TYPES:
        out = _indexed(ix, local, now)
        return replace(ix, next_idx=ix.next_idx + 1), out
    if kind in SKIPPED_EVENT_TYPES:
        return replace(ix, skipped=ix.skipped + 1), None
    return (
        replace(
            ix,
            rejected=ix.rejected + 1,
            rejected_types=_count(ix.rejected_types, kind.__name__),
        ),
        None,
    )


def _drain(
    ix: Indexer, key: StreamKey, now: datetime, progressed: bool = False
) -> tuple[Indexer, list[IndexedEvent]]:
    """Release the contiguous run of held events starting at the expected sequence.
    `progressed`: the caller already advanced the stream (the gap clock restarts)."""
    held = dict(ix.pending.get(key, {}))
    expected = ix.expected[key]
    out: list[IndexedEvent] = []
    while expected in held:
        ix, indexed = _release_one(ix, held.pop(expected), now)
        if indexed is not None:
            out.append(indexed)
        expected += 1
    pending = {k: v for k, v in ix.pending.items() if k != key}
    gap_since = {k: v for k, v in ix.gap_since.items() if k != key}
    if held:
        pending[key] = held
        # The gap clock restarts whenever the stream makes progress: it measures how long
        # the *current* missing sequence has been awaited.
        stalled = not progressed and expected == ix.expected[key]
        gap_since[key] = ix.gap_since.get(key, now) if stalled else now
    return (
        replace(ix, expected={**ix.expected, key: expected}, pending=pending, gap_since=gap_since),
        out,
    )


def _skip_gap_if_stale(ix: Indexer, key: StreamKey, now: datetime) -> tuple[Indexer, list[IndexedEvent]]:
    since = ix.gap_since.get(key)
    held = ix.pending.get(key)
    if since is None or not held or (now - since).total_seconds() < MAX_GAP_WAIT_S:
        return ix, []
    lowest = min(held)
    missing = lowest - ix.expected[key]
    ix = replace(
        ix,
        expected={**ix.expected, key: lowest},
        gaps_skipped=ix.gaps_skipped + missing,
    )
    return _drain(ix, key, now)


def _start_stream(ix: Indexer, key: StreamKey, seq: int) -> Indexer:
    """First sight of a stream: remember it, evicting the oldest streams past the bounds."""
    expected = {**ix.expected, key: seq}
    floors = {k: v for k, v in ix.floors.items() if k != key}
    origin = key[0]
    same_origin = [k for k in expected if k[0] == origin]
    evict = same_origin[: max(0, len(same_origin) - MAX_SESSIONS_PER_ORIGIN)]
    overall = [k for k in expected if k not in evict]
    evict += overall[: max(0, len(overall) - MAX_TRACKED_STREAMS)]
    if not evict:
        return replace(ix, expected=expected, floors=floors)
    gone = set(evict)
    return replace(
        ix,
        expected={k: v for k, v in expected.items() if k not in gone},
        pending={k: v for k, v in ix.pending.items() if k not in gone},
        gap_since={k: v for k, v in ix.gap_since.items() if k not in gone},
        floors=floors,
        streams_evicted=ix.streams_evicted + len(gone),
    )


def _hold(ix: Indexer, key: StreamKey, local: LocalEvent, now: datetime) -> Indexer:
    held = dict(ix.pending.get(key, {}))
    if local.origin_seq in held:
        return replace(ix, duplicates=ix.duplicates + 1)
    held[local.origin_seq] = local
    overflow = ix.overflow
    if len(held) > MAX_PENDING_PER_ORIGIN:
        # Drop the highest: it is the furthest from release, and the lower ones are what
        # the gap, once filled, lets through first.
        del held[max(held)]
        overflow += 1
    return replace(
        ix,
        pending={**ix.pending, key: held},
        gap_since={**ix.gap_since, key: ix.gap_since.get(key, now)},
        overflow=overflow,
    )


# -- entry points ---------------------------------------------------------------------------


def admit(ix: Indexer, local: LocalEvent, now: datetime) -> tuple[Indexer, list[IndexedEvent]]:
    """Offer one producer's LocalEvent; returns the successor and the events it released,
    in index order (possibly none, possibly a whole held run)."""
    key: StreamKey = (local.origin, local.origin_session)
    seq = local.origin_seq
    if key not in ix.expected:
        floor = ix.floors.get(key)
        if floor is not None and seq < floor:
            return replace(ix, duplicates=ix.duplicates + 1), []
        ix = _start_stream(ix, key, seq)
    expected = ix.expected[key]
    if seq < expected:
        return replace(ix, duplicates=ix.duplicates + 1), []
    if seq > expected:
        ix = _hold(ix, key, local, now)
        return _skip_gap_if_stale(ix, key, now)
    # In sequence: release it directly (holding it first could overflow a full stream and
    # drop the very run it is about to let through), then whatever it unblocks.
    ix, indexed = _release_one(ix, local, now)
    ix = replace(ix, expected={**ix.expected, key: seq + 1})
    ix, released = _drain(ix, key, now, progressed=True)
    return ix, ([indexed] if indexed is not None else []) + released


def release_stale(ix: Indexer, now: datetime) -> tuple[Indexer, list[IndexedEvent]]:
    """Skip every gap that has been open for `MAX_GAP_WAIT_S` and release what it held.
    The shell calls this on its periodic tick, so a stream whose producer went quiet
    right after a lost packet is not held forever."""
    out: list[IndexedEvent] = []
    for key in list(ix.gap_since):
        ix, released = _skip_gap_if_stale(ix, key, now)
        out.extend(released)
    return ix, out


def index_own(
    ix: Indexer, events: Sequence[Event], origin: NodeId, now: datetime
) -> tuple[Indexer, list[IndexedEvent]]:
    """Index the master's own decisions (from commands and its plan loop) in the order
    given: no allowlist, no sequence, they are already ordered by the master itself."""
    out = [
        IndexedEvent(idx=ix.next_idx + i, origin=origin, indexed_at=now, event=event)
        for i, event in enumerate(events)
    ]
    return replace(ix, next_idx=ix.next_idx + len(out)), out


__all__ = [
    "MAX_GAP_WAIT_S",
    "MAX_PENDING_PER_ORIGIN",
    "MAX_SESSIONS_PER_ORIGIN",
    "MAX_TRACKED_STREAMS",
    "PRODUCER_EVENT_TYPES",
    "SKIPPED_EVENT_TYPES",
    "Indexer",
    "admit",
    "index_own",
    "new_indexer",
    "release_stale",
    "resume_indexer",
]
