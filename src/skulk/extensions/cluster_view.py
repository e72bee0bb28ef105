"""What `ExtensionContext.read_cluster()` returns: an immutable per-node snapshot of the
cluster built from the replicated State and the telemetry plane, so an extension can see
the fabric it belongs to without touching State or the event log.

`cluster_view` is pure (the caller passes the clock readings in); it never does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from skulk.shared.telemetry_view import NODE_TIMEOUT_S, TelemetryView, freshness
from skulk.shared.types.ids import NodeId
from skulk.shared.types.state import State
from skulk.shared.types.telemetry import NodeResources

Role = Literal["master", "member"]
Liveness = Literal["alive", "stale", "unknown"]


@dataclass(frozen=True)
class NodeView:
    """One member as the plane describes it. `capabilities` are the tags it advertises
    (`ExtensionContext.advertise_capability` on that node)."""

    node_id: str
    node_name: str
    version: str
    role: Role
    liveness: Liveness
    backends: tuple[str, ...]
    accelerator_vendor: str | None
    capabilities: tuple[str, ...]
    is_self: bool


def accelerator_vendor(resources: NodeResources | None) -> str | None:
    """The vendor of the node's first accelerator; "apple" for a Metal node (its GPU has no
    discrete reading); None for a CPU-only node or one not heard from yet."""
    if resources is None:
        return None
    if resources.gpus:
        return resources.gpus[0].vendor
    if any(backend.startswith("mlx") and not backend.endswith("-cpu") for backend in resources.backends):
        return "apple"
    return None


def liveness_of(age_s: float | None) -> Liveness:
    if age_s is None:
        return "unknown"
    return "alive" if age_s < NODE_TIMEOUT_S else "stale"


def cluster_view(
    state: State, telemetry: TelemetryView, master_id: str | None, self_id: str, now: float, now_utc: datetime
) -> tuple[NodeView, ...]:
    """Every member of `state`, sorted by node id. `now` is on the telemetry view's
    monotonic clock; `now_utc` is compared with the members' last logged events."""
    views: list[NodeView] = []
    for node_id, info in sorted(state.nodes.items()):
        node = telemetry.nodes.get(node_id)
        resources = node.resources if node is not None else None
        age = freshness(telemetry, state, NodeId(node_id), now, now_utc).effective_age_s
        views.append(
            NodeView(
                node_id=node_id,
                node_name=info.node_name,
                version=resources.version if resources is not None else info.version,
                role="master" if node_id == master_id else "member",
                liveness=liveness_of(age),
                backends=tuple(resources.backends) if resources is not None else (),
                accelerator_vendor=accelerator_vendor(resources),
                capabilities=tuple(resources.capability_tags) if resources is not None else (),
                is_self=node_id == self_id,
            )
        )
    return tuple(views)
