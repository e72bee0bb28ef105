"""The replicated cluster State: the fold of every indexed event, identical on every node.

State is frozen; only `skulk.shared.apply.apply` produces a successor, and it never mutates
its input. Latest-value telemetry (memory, disk, heartbeats, download progress) is NOT here:
it lives in each node's telemetry view. `NodeInfo.last_seen` is "last logged event", not
liveness.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, field_validator

from skulk.shared.types.base import WireModel
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.common import (
    Edge,
    NetworkInterface,
    NonNegInt,
    UtcDatetime,
    canonical_edges,
)
from skulk.shared.types.ids import DownloadAttemptId, InstanceId, ModelId, NodeId, RunnerId, TaskId
from skulk.shared.types.instances import Instance, RunnerStatus
from skulk.shared.types.tasks import Task


class NodeInfo(WireModel):
    node_id: NodeId
    node_name: str
    version: str
    api_endpoint: str | None = None
    last_seen: UtcDatetime | None = None


class DownloadStatusPending(WireModel):
    type: Literal["DownloadStatusPending"] = "DownloadStatusPending"
    attempt_id: DownloadAttemptId


class DownloadStatusCompleted(WireModel):
    type: Literal["DownloadStatusCompleted"] = "DownloadStatusCompleted"
    attempt_id: DownloadAttemptId
    total_bytes: NonNegInt


class DownloadStatusFailed(WireModel):
    type: Literal["DownloadStatusFailed"] = "DownloadStatusFailed"
    attempt_id: DownloadAttemptId
    error_message: str


DownloadStatus = Annotated[
    DownloadStatusPending | DownloadStatusCompleted | DownloadStatusFailed,
    Field(discriminator="type"),
]
DOWNLOAD_STATUS_ADAPTER: TypeAdapter[DownloadStatus] = TypeAdapter(DownloadStatus)


class RepairFailure(WireModel):
    """Why the master stopped repairing a model's placement (see InstanceRepairAbandoned):
    visible in GET /state so an operator sees the end of a repair chain, not a silent gap."""

    instance_id: InstanceId
    node_id: NodeId | None = None
    repair_hop: NonNegInt
    reason: str


class State(WireModel):
    nodes: dict[NodeId, NodeInfo] = Field(default_factory=dict)
    edges: list[Edge] = Field(default_factory=list)
    node_network: dict[NodeId, list[NetworkInterface]] = Field(default_factory=dict)
    instances: dict[InstanceId, Instance] = Field(default_factory=dict)
    runners: dict[RunnerId, RunnerStatus] = Field(default_factory=dict)
    tasks: dict[TaskId, Task] = Field(default_factory=dict)
    downloads: dict[NodeId, dict[ModelId, DownloadStatus]] = Field(default_factory=dict)
    tracing_enabled: bool = False
    custom_cards: dict[ModelId, ModelCard] = Field(default_factory=dict)
    repair_failures: dict[ModelId, RepairFailure] = Field(default_factory=dict)
    """The last abandoned repair per model; cleared when the model is placed again."""
    last_event_applied_idx: int = Field(default=-1, ge=-1)

    @field_validator("edges")
    @classmethod
    def _canonical_edges(cls, edges: list[Edge]) -> list[Edge]:
        # A snapshot from any source lands in the one canonical order, so hashes agree.
        return canonical_edges(edges)

    def graph_node_ids(self) -> list[NodeId]:
        """Every node the topology graph draws, sorted: members plus edge endpoints."""
        ids = set(self.nodes)
        for edge in self.edges:
            ids.add(edge.source)
            ids.add(edge.sink)
        return sorted(ids)

    def phantom_node_ids(self) -> list[NodeId]:
        """Graph-only nodes, sorted: seen on an edge but never joined. They vanish with their
        last edge, since membership timeouts only reap nodes that joined."""
        return [n for n in self.graph_node_ids() if n not in self.nodes]

    def runner_ids(self) -> set[RunnerId]:
        """Runners that belong to a live instance (status or not)."""
        return {r for inst in self.instances.values() for r in inst.runner_ids()}


__all__ = [
    "DOWNLOAD_STATUS_ADAPTER",
    "DownloadStatus",
    "DownloadStatusCompleted",
    "DownloadStatusFailed",
    "DownloadStatusPending",
    "NodeInfo",
    "RepairFailure",
    "State",
]
