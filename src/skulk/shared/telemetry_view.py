"""The TelemetryView: each node's latest telemetry readings, stamped with local receipt time.

Telemetry is latest-value and unordered, so it never enters State; it lands here. Every
reading is stamped with the *receiver's* clock (`received_at`, a monotonic float the shell
reads), never a time the sender wrote: liveness must not depend on two machines agreeing on
the wall clock. `freshness` combines the three liveness signals (dedicated heartbeat, any
other telemetry, the last logged event in State) into one `NodeFreshness` that the master's
prune decision and the API's health summary both read.

Pure data in, data out: this module must never read a clock, do I/O or trust a reading's
own claim of who sent it (the authenticated envelope sender decides).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal

from skulk.shared.types.ids import DownloadAttemptId, ModelId, NodeId
from skulk.shared.types.state import DownloadStatusPending, State
from skulk.shared.types.telemetry import (
    DownloadProgress,
    NodeHeartbeat,
    NodeResources,
    TelemetryReading,
)

MAX_TELEMETRY_KEYS = 256
"""Distinct (node, reading kind[, model]) keys the view holds: the seed's 256-key telemetry
admission map. At the bound the least recently written key is evicted and counted."""

MAX_RETIRED_ATTEMPTS = 4
"""Superseded download attempt ids remembered per (node, model), so a delayed sample of an
attempt that was already replaced cannot override the newer one."""

NODE_TIMEOUT_S = 30.0
"""A node whose freshest liveness signal is this old is pruned by the master."""

HEARTBEAT_WARN_S = 10.0
"""A dedicated heartbeat gap this long is worth one warning (heartbeats come every ~2 s)."""

ReadingKind = Literal["NodeHeartbeat", "NodeResources", "DownloadProgress"]
TelemetryKey = tuple[NodeId, ReadingKind, ModelId | None]


@dataclass(frozen=True)
class NodeTelemetry:
    """One node's latest readings. `telemetry_at` is the receipt time of the last reading
    that was not a heartbeat (the fallback liveness signal)."""

    heartbeat_at: float | None = None
    telemetry_at: float | None = None
    resources: NodeResources | None = None
    downloads: Mapping[ModelId, DownloadProgress] = field(default_factory=dict[ModelId, DownloadProgress])
    retired_attempts: Mapping[ModelId, tuple[DownloadAttemptId, ...]] = field(
        default_factory=dict[ModelId, tuple[DownloadAttemptId, ...]])
    download_timing: Mapping[ModelId, DownloadTiming] = field(default_factory=dict[ModelId, "DownloadTiming"])
    """When the recorded attempt's first and latest samples arrived: its transfer rate."""


@dataclass(frozen=True)
class DownloadTiming:
    """Receipt times (local monotonic) of one attempt's first and latest samples, and the
    bytes the first one reported: enough for an average rate without keeping samples."""

    attempt_id: DownloadAttemptId
    first_at: float
    first_bytes: int
    last_at: float


@dataclass(frozen=True)
class TelemetryView:
    """`keys` is ordered oldest write first: the eviction order. `ignored` counts readings
    whose claimed node was not the sender; `stale` counts download samples dropped as
    older than what was already recorded."""

    nodes: Mapping[NodeId, NodeTelemetry] = field(default_factory=dict[NodeId, NodeTelemetry])
    evicted: int = 0
    keys: tuple[TelemetryKey, ...] = ()
    ignored: int = 0
    stale: int = 0

    def stats(self) -> dict[str, int]:
        """Depth, capacity and drops for /v1/diagnostics/telemetry."""
        return {
            "keys": len(self.keys),
            "capacity": MAX_TELEMETRY_KEYS,
            "evicted": self.evicted,
            "ignored": self.ignored,
            "stale": self.stale,
        }


def new_view() -> TelemetryView:
    return TelemetryView()


# -- recording ------------------------------------------------------------------------------


def _key_of(reading: TelemetryReading) -> TelemetryKey:
    model = reading.model_id if isinstance(reading, DownloadProgress) else None
    return (reading.node_id, reading.type, model)


def _accept_progress(node: NodeTelemetry, sample: DownloadProgress) -> bool:
    """Is `sample` newer than what is recorded for its model? Attempt ids are opaque, so
    "older" means: an attempt already seen replaced, or a same-attempt sample whose byte
    count went backwards (a delayed packet; bytes only grow within an attempt)."""
    if sample.attempt_id in node.retired_attempts.get(sample.model_id, ()):
        return False
    current = node.downloads.get(sample.model_id)
    return (
        current is None
        or current.attempt_id != sample.attempt_id
        or sample.downloaded_bytes >= current.downloaded_bytes
    )


def _with_progress(node: NodeTelemetry, sample: DownloadProgress, received_at: float) -> NodeTelemetry:
    current = node.downloads.get(sample.model_id)
    timing = node.download_timing.get(sample.model_id)
    if timing is None or timing.attempt_id != sample.attempt_id:
        timing = DownloadTiming(sample.attempt_id, received_at, sample.downloaded_bytes, received_at)
    else:
        timing = replace(timing, last_at=received_at)
    retired = dict(node.retired_attempts)
    if current is not None and current.attempt_id != sample.attempt_id:
        history = (*retired.get(sample.model_id, ()), current.attempt_id)
        retired[sample.model_id] = history[-MAX_RETIRED_ATTEMPTS:]
    return replace(
        node,
        downloads={**node.downloads, sample.model_id: sample},
        retired_attempts=retired,
        download_timing={**node.download_timing, sample.model_id: timing},
    )


def _store(node: NodeTelemetry, reading: TelemetryReading, received_at: float) -> NodeTelemetry:
    if isinstance(reading, NodeHeartbeat):
        return replace(node, heartbeat_at=received_at)
    node = replace(node, telemetry_at=received_at)
    if isinstance(reading, NodeResources):
        return replace(node, resources=reading)
    return _with_progress(node, reading, received_at)


def _drop_key(nodes: dict[NodeId, NodeTelemetry], key: TelemetryKey) -> None:
    """Remove one evicted key's value from `nodes` (a fresh dict owned by the caller)."""
    node_id, kind, model = key
    node = nodes.get(node_id)
    if node is None:
        return
    if kind == "NodeHeartbeat":
        node = replace(node, heartbeat_at=None)
    elif kind == "NodeResources":
        node = replace(node, resources=None)
    else:
        node = replace(
            node,
            downloads={m: p for m, p in node.downloads.items() if m != model},
            retired_attempts={m: a for m, a in node.retired_attempts.items() if m != model},
            download_timing={m: t for m, t in node.download_timing.items() if m != model},
        )
    if node.heartbeat_at is None and node.resources is None and not node.downloads:
        # Nothing left but a receipt time: forget the node, so the view's size stays
        # bounded by its keys however many identities come and go.
        del nodes[node_id]
    else:
        nodes[node_id] = node


def record(
    view: TelemetryView, sender: NodeId, reading: TelemetryReading, received_at: float
) -> TelemetryView:
    """Fold one reading received from the authenticated `sender` at local time `received_at`.

    A reading about another node is ignored (counted): a node speaks only for itself. A
    download sample older than what is recorded still proves the sender alive (its receipt
    time is stamped) but does not replace the recorded progress."""
    if reading.node_id != sender:
        return replace(view, ignored=view.ignored + 1)
    node = view.nodes.get(sender, NodeTelemetry())
    if isinstance(reading, DownloadProgress) and not _accept_progress(node, reading):
        stamped = replace(node, telemetry_at=received_at)
        return replace(view, nodes={**view.nodes, sender: stamped}, stale=view.stale + 1)

    key = _key_of(reading)
    nodes = {**view.nodes, sender: _store(node, reading, received_at)}
    keys = [k for k in view.keys if k != key]
    evicted = view.evicted
    while len(keys) >= MAX_TELEMETRY_KEYS:
        _drop_key(nodes, keys.pop(0))
        evicted += 1
    keys.append(key)
    return replace(view, nodes=nodes, keys=tuple(keys), evicted=evicted)


def forget(view: TelemetryView, node_id: NodeId) -> TelemetryView:
    """Drop everything about a node (it left or was pruned)."""
    if node_id not in view.nodes:
        return view
    return replace(
        view,
        nodes={n: t for n, t in view.nodes.items() if n != node_id},
        keys=tuple(k for k in view.keys if k[0] != node_id),
    )


# -- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFreshness:
    """Ages, in seconds, of a node's three liveness signals; None where never observed."""

    heartbeat_age_s: float | None = None
    telemetry_age_s: float | None = None
    last_event_age_s: float | None = None

    @property
    def effective_age_s(self) -> float | None:
        """The freshest known signal decides: a node is as alive as its latest sign of life."""
        known = [
            a
            for a in (self.heartbeat_age_s, self.telemetry_age_s, self.last_event_age_s)
            if a is not None
        ]
        return min(known) if known else None


def _age(now: float, at: float | None) -> float | None:
    # Clamped at zero: a receipt stamped after `now` (the caller read its clock first)
    # is simply fresh, never a negative age.
    return None if at is None else max(0.0, now - at)


def freshness(
    view: TelemetryView, state: State, node_id: NodeId, now: float, now_utc: datetime
) -> NodeFreshness:
    """`now` is on the same monotonic clock as `record`'s `received_at`; `now_utc` is compared
    with `state.nodes[node_id].last_seen` (the index time of its last logged event)."""
    node = view.nodes.get(node_id, NodeTelemetry())
    info = state.nodes.get(node_id)
    last_seen = info.last_seen if info is not None else None
    last_event_age = (
        None if last_seen is None else max(0.0, (now_utc - last_seen).total_seconds())
    )
    return NodeFreshness(
        heartbeat_age_s=_age(now, node.heartbeat_at),
        telemetry_age_s=_age(now, node.telemetry_at),
        last_event_age_s=last_event_age,
    )


def all_freshness(
    view: TelemetryView, state: State, now: float, now_utc: datetime
) -> dict[NodeId, NodeFreshness]:
    """Freshness of every member in State, sorted by node id (what the master plan reads)."""
    return {n: freshness(view, state, n, now, now_utc) for n in sorted(state.nodes)}


def node_resources(view: TelemetryView, state: State) -> dict[NodeId, NodeResources]:
    """Latest NodeResources of every member that has sent one, sorted by node id: the map
    GET /state merges back under `nodeResources`."""
    return {
        n: t.resources
        for n, t in sorted(view.nodes.items())
        if n in state.nodes and t.resources is not None
    }


def live_download_progress(
    view: TelemetryView, state: State
) -> dict[NodeId, dict[ModelId, DownloadProgress]]:
    """Progress samples still worth showing: only for the attempt State says is pending.
    A sample of an attempt that State already completed, failed or replaced (the ordered
    decision) is stale however late it arrived."""
    out: dict[NodeId, dict[ModelId, DownloadProgress]] = {}
    for node_id, node in sorted(view.nodes.items()):
        decided = state.downloads.get(node_id, {})
        live = {
            m: p
            for m, p in sorted(node.downloads.items())
            if isinstance(decided.get(m), DownloadStatusPending)
            and decided[m].attempt_id == p.attempt_id
        }
        if live:
            out[node_id] = live
    return out


__all__ = [
    "HEARTBEAT_WARN_S",
    "MAX_RETIRED_ATTEMPTS",
    "MAX_TELEMETRY_KEYS",
    "NODE_TIMEOUT_S",
    "DownloadTiming",
    "NodeFreshness",
    "NodeTelemetry",
    "TelemetryKey",
    "TelemetryView",
    "all_freshness",
    "forget",
    "freshness",
    "live_download_progress",
    "new_view",
    "node_resources",
    "record",
]
