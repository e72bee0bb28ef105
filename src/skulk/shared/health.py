"""Derived per-node health for GET /state: why a node is being routed around, and the fix.

`derive_node_health` reads replicated State and the local TelemetryView and says, per member,
ok / warn / error with reasons an operator can act on (each with a message and a
remediation). It is read-only and recomputed on every request, never stored or gossiped:
the dashboard's amber/red badge is a view of facts already in the response.

Pure: no clock, no I/O. `now` is the monotonic clock the view's receipt times use; `now_utc`
is compared with State's `last_seen`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from skulk.shared.telemetry_view import (
    HEARTBEAT_WARN_S,
    NODE_TIMEOUT_S,
    NodeFreshness,
    TelemetryView,
    freshness,
)
from skulk.shared.types.base import WireModel
from skulk.shared.types.ids import NodeId
from skulk.shared.types.state import DownloadStatusFailed, State
from skulk.shared.types.telemetry import NodeResources

GIB = 1024**3

DEFAULT_RESERVE_BYTES = 10 * GIB
"""The download reserve assumed for a node that did not advertise its own (the default
`model_store.disk_reserve_gb`)."""

DISK_LOW_HEADROOM_BYTES = 10 * GIB
"""Room above the node's reserve under which a typical model may no longer fit: warn before
a download is refused."""

DISK_LOW_WARN_BYTES = DEFAULT_RESERVE_BYTES + DISK_LOW_HEADROOM_BYTES
"""The warning line for a node with the default reserve."""

DISK_FULL_ERROR_BYTES = 2 * GIB
"""Free space below which downloads and the event log will fail outright."""

PRUNE_RISK_S = 20.0
"""Effective liveness age at which a node is reported at risk of pruning (the master prunes
at NODE_TIMEOUT_S): two thirds of the way, while there is still time to act."""

ReasonLevel = Literal["info", "warn", "error"]
HealthLevel = Literal["ok", "warn", "error"]

_SEVERITY: Mapping[str, int] = {"info": 0, "warn": 1, "error": 2}


class HealthReason(WireModel):
    """One problem on a node. `level` is normally warn or error; a node's own capability
    conflicts are passed through as reported, so an `info` one may appear (it does not
    raise the node's level)."""

    code: str
    level: ReasonLevel
    message: str
    remediation: str | None = None


class NodeHealth(WireModel):
    level: HealthLevel
    reasons: list[HealthReason]


# -- reasons, one small function each -------------------------------------------------------


def heartbeat_reasons(node_id: NodeId, f: NodeFreshness) -> list[HealthReason]:
    effective = f.effective_age_s
    if effective is not None and effective >= PRUNE_RISK_S:
        return [
            HealthReason(
                code="heartbeat_late",
                level="error",
                message=(
                    f"node {node_id} has shown no sign of life for {effective:.0f}s and is at "
                    f"risk of pruning (pruned at {NODE_TIMEOUT_S:.0f}s)"
                ),
                remediation=(
                    "check that the node's skulk process is running and that it can reach the "
                    "other nodes (network, firewall, cluster key)"
                ),
            )
        ]
    if f.heartbeat_age_s is not None and f.heartbeat_age_s >= HEARTBEAT_WARN_S:
        return [
            HealthReason(
                code="heartbeat_late",
                level="warn",
                message=f"node {node_id} heartbeat is {f.heartbeat_age_s:.0f}s late",
                remediation=(
                    "the node may be overloaded or its network congested; check its load and "
                    "connectivity"
                ),
            )
        ]
    return []


def download_reasons(state: State, node_id: NodeId) -> list[HealthReason]:
    return [
        HealthReason(
            code="download_failed",
            level="error",
            message=f"download of {model_id} failed: {status.error_message}",
            remediation=(
                "fix the cause (disk space, network access to the model hub, credentials), "
                "then start the download again or relaunch the model"
            ),
        )
        for model_id, status in sorted(state.downloads.get(node_id, {}).items())
        if isinstance(status, DownloadStatusFailed)
    ]


def disk_reasons(resources: NodeResources | None) -> list[HealthReason]:
    if resources is None:
        return []
    disk = resources.disk
    free_gib = disk.free_bytes / GIB
    if disk.free_bytes < DISK_FULL_ERROR_BYTES:
        return [
            HealthReason(
                code="disk_full",
                level="error",
                message=f"models volume {disk.models_dir} is full: {free_gib:.1f} GiB free; the node keeps "
                        f"serving degraded: every download to it is refused, and an event log on this "
                        f"volume only counts (writes nothing)",
                remediation="free space on the models volume (delete unused models) or move it to a larger disk",
            )
        ]
    reserve = DEFAULT_RESERVE_BYTES if disk.reserve_bytes is None else disk.reserve_bytes
    if disk.free_bytes < reserve:
        return [
            HealthReason(
                code="disk_low",
                level="warn",
                message=f"models volume {disk.models_dir} has {free_gib:.1f} GiB free, under its "
                        f"{reserve / GIB:g} GiB download reserve: every download to this node is refused",
                remediation="free space on the models volume (delete unused models), or lower "
                            "model_store.disk_reserve_gb (SKULK_DISK_RESERVE_GB)",
            )
        ]
    if disk.free_bytes < reserve + DISK_LOW_HEADROOM_BYTES:
        return [
            HealthReason(
                code="disk_low",
                level="warn",
                message=f"models volume {disk.models_dir} is low: {free_gib:.1f} GiB free "
                        f"({reserve / GIB:g} GiB of it kept as the download reserve)",
                remediation="free space before the next download is refused (delete unused models)",
            )
        ]
    return []


def capability_reasons(resources: NodeResources | None) -> list[HealthReason]:
    if resources is None:
        return []
    return [
        HealthReason(code=c.code, level=c.level, message=c.message, remediation=c.remediation)
        for c in resources.capability_conflicts
    ]


def build_of(resources: NodeResources) -> str:
    """A node's build as people read it: '0.1.0', or '0.1.0 (3f2a9c1d0e4b)' with its commit."""
    return resources.version if not resources.commit else f"{resources.version} ({resources.commit})"


def version_mismatch_reason(resources: Mapping[NodeId, NodeResources]) -> HealthReason | None:
    """One shared reason when the live members run different builds (package version or
    source commit), naming the nodes on each and which to upgrade: those off the build most
    nodes run (a tie goes to the lexically first build). A member with no resource reading
    yet is unknown, not a mismatch."""
    by_build: dict[str, list[str]] = {}
    for node_id, r in sorted(resources.items()):
        by_build.setdefault(build_of(r), []).append(r.node_name or node_id)
    if len(by_build) < 2:
        return None
    spread = "; ".join(f"{build} on {', '.join(names)}" for build, names in sorted(by_build.items()))
    keep = max(sorted(by_build), key=lambda build: len(by_build[build]))
    behind = sorted(name for build, names in by_build.items() if build != keep for name in names)
    return HealthReason(
        code="version_mismatch",
        level="warn",
        message=f"nodes run different skulk builds: {spread}",
        remediation=f"upgrade {', '.join(behind)} to {keep} (the build most nodes run), or every node to one build",
    )


def zenoh_isolated_reason(
    node_id: NodeId, resources: Mapping[NodeId, NodeResources]
) -> HealthReason | None:
    """A node advertising zero Zenoh peers while other live members advertise a Zenoh
    count: its control plane may look fine but every remote stream through it will die.
    An unknown (null) count is the startup grace window, never a problem."""
    mine = resources.get(node_id)
    peers = getattr(mine, "zenoh_connected_peers", None)
    others = [
        n for n, r in resources.items()
        if n != node_id and getattr(r, "zenoh_connected_peers", None) is not None
    ]
    if peers != 0 or not others:
        return None
    return HealthReason(
        code="zenoh_isolated",
        level="error",
        message=(
            f"node {node_id} has no Zenoh peer connections while {len(others)} other "
            f"member(s) are on the Zenoh mesh"
        ),
        remediation=(
            "multicast scouting cannot reach this node (routed or overlay network?): start it "
            "with --bootstrap-peers tcp/<host>:<port> naming another node"
        ),
    )


def _level(reasons: list[HealthReason]) -> HealthLevel:
    worst = max((_SEVERITY[r.level] for r in reasons), default=0)
    return "error" if worst == 2 else "warn" if worst == 1 else "ok"


# -- entry point ----------------------------------------------------------------------------


def derive_node_health(
    state: State, telemetry: TelemetryView, now: float, now_utc: datetime
) -> dict[NodeId, NodeHealth]:
    """Health of every member in State, sorted by node id. Reasons come in a fixed order:
    liveness, downloads, disk, capability conflicts, Zenoh isolation, version."""
    live_resources = {
        n: t.resources
        for n, t in telemetry.nodes.items()
        if n in state.nodes and t.resources is not None
    }
    mismatch = version_mismatch_reason(live_resources)
    out: dict[NodeId, NodeHealth] = {}
    for node_id in sorted(state.nodes):
        resources = live_resources.get(node_id)
        reasons = [
            *heartbeat_reasons(node_id, freshness(telemetry, state, node_id, now, now_utc)),
            *download_reasons(state, node_id),
            *disk_reasons(resources),
            *capability_reasons(resources),
            *([isolated] if (isolated := zenoh_isolated_reason(node_id, live_resources)) else []),
            *([mismatch] if mismatch is not None else []),
        ]
        out[node_id] = NodeHealth(level=_level(reasons), reasons=reasons)
    return out


def health_to_wire(health: Mapping[NodeId, NodeHealth]) -> dict[str, dict[str, Any]]:
    """The JSON-ready camelCase form GET /state embeds (`{nodeId: {level, reasons}}`)."""
    return {n: h.to_wire() for n, h in health.items()}


__all__ = [
    "DISK_FULL_ERROR_BYTES",
    "DISK_LOW_WARN_BYTES",
    "PRUNE_RISK_S",
    "HealthReason",
    "NodeHealth",
    "capability_reasons",
    "derive_node_health",
    "disk_reasons",
    "download_reasons",
    "health_to_wire",
    "heartbeat_reasons",
    "version_mismatch_reason",
    "zenoh_isolated_reason",
]
