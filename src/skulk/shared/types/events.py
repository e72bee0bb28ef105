"""Events: past-tense facts, the only input to `apply()`.

Producers publish an event wrapped in a `LocalEvent` (origin node, session, sequence); only
the elected master orders them, dedups by (origin, origin_session, origin_seq), assigns the
index and republishes `IndexedEvent`s. Once indexed an event is immutable history, so its
shape changes only with the wire version. Events carry ids minted by the producer; nothing
here may be derived from a clock or randomness at apply time.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, TypeAdapter, model_serializer

from skulk.shared.types.base import WireModel
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.common import (
    Edge,
    FiniteFloat,
    NetworkInterface,
    NonNegInt,
    TaskStatus,
    UtcDatetime,
)
from skulk.shared.types.ids import (
    DownloadAttemptId,
    EventId,
    InstanceId,
    ModelId,
    NodeId,
    RunnerId,
    SessionId,
    TaskId,
)
from skulk.shared.types.instances import Instance, RunnerStatus
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.tasks import Task

NonNegFloat = Annotated[FiniteFloat, Field(ge=0)]


class _EventBase(WireModel):
    event_id: EventId


# -- membership and topology -------------------------------------------------------------


class NodeJoined(_EventBase):
    type: Literal["NodeJoined"] = "NodeJoined"
    node_id: NodeId
    node_name: str
    version: str
    api_endpoint: str | None = None


class NodeLeft(_EventBase):
    type: Literal["NodeLeft"] = "NodeLeft"
    node_id: NodeId


class NodeTimedOut(_EventBase):
    """The master pruned a silent node. The ages that decided it are persisted so the log
    explains the prune after the ephemeral receipt times are gone. `cause` says which
    signal decided: the silence timeout, or the loss of the node's transport presence
    (then `timeout_s` is the confirmation delay and `effective_age_s` how long it was gone)."""

    type: Literal["NodeTimedOut"] = "NodeTimedOut"
    node_id: NodeId
    last_event_age_s: NonNegFloat
    heartbeat_age_s: NonNegFloat | None = None
    telemetry_age_s: NonNegFloat | None = None
    effective_age_s: NonNegFloat
    timeout_s: NonNegFloat
    cause: Literal["silence", "presence_lost"] = "silence"


class NodeNetworkUpdated(_EventBase):
    type: Literal["NodeNetworkUpdated"] = "NodeNetworkUpdated"
    node_id: NodeId
    interfaces: list[NetworkInterface] = Field(default_factory=list)


class TopologyEdgeCreated(_EventBase):
    type: Literal["TopologyEdgeCreated"] = "TopologyEdgeCreated"
    edge: Edge


class TopologyEdgeDeleted(_EventBase):
    type: Literal["TopologyEdgeDeleted"] = "TopologyEdgeDeleted"
    edge: Edge


# -- instances and runners -----------------------------------------------------------------


class InstanceCreated(_EventBase):
    type: Literal["InstanceCreated"] = "InstanceCreated"
    instance: Instance


class InstanceDeleted(_EventBase):
    type: Literal["InstanceDeleted"] = "InstanceDeleted"
    instance_id: InstanceId
    reason: str


class InstancePlacementRefused(_EventBase):
    """A worker's pre-load guard refused its shard; the master re-places (bounded by the
    instance's `repair_hop`). Recorded for the log; it does not change State by itself."""

    type: Literal["InstancePlacementRefused"] = "InstancePlacementRefused"
    instance_id: InstanceId
    node_id: NodeId
    needed_bytes: NonNegInt
    available_bytes: NonNegInt
    message: str


class InstanceRepairAbandoned(_EventBase):
    """The master gave up re-placing a model after a repair teardown: a refusal at the last
    repair hop, or no healthy node set left. Terminal by design, so a refusal chain can never
    oscillate; `apply` records it in `State.repair_failures` until the model is placed again."""

    type: Literal["InstanceRepairAbandoned"] = "InstanceRepairAbandoned"
    model_id: ModelId
    instance_id: InstanceId
    """The torn-down instance whose repair was abandoned."""
    node_id: NodeId | None = None
    """The node that refused, or whose download failed; None when no single node is to blame."""
    repair_hop: NonNegInt
    reason: str


class RunnerStatusUpdated(_EventBase):
    type: Literal["RunnerStatusUpdated"] = "RunnerStatusUpdated"
    runner_id: RunnerId
    status: RunnerStatus


class RunnerDeleted(_EventBase):
    type: Literal["RunnerDeleted"] = "RunnerDeleted"
    runner_id: RunnerId


# -- tasks ----------------------------------------------------------------------------------


class TaskCreated(_EventBase):
    type: Literal["TaskCreated"] = "TaskCreated"
    task: Task


class TaskAcknowledged(_EventBase):
    type: Literal["TaskAcknowledged"] = "TaskAcknowledged"
    task_id: TaskId


class TaskStatusUpdated(_EventBase):
    type: Literal["TaskStatusUpdated"] = "TaskStatusUpdated"
    task_id: TaskId
    status: TaskStatus
    error_message: str | None = None
    error_type: StreamErrorType | str | None = None
    """On a Failed status: the runner's typed cause (RunnerCrashed, EngineError, ...), kept on
    the task so the owning API ends the stream with it even when this event reaches it before
    the runner's failed terminal frame (control and data planes are not ordered)."""


class TaskFailed(_EventBase):
    """Terminal failure of a task; the owning API turns it into an error on the stream."""

    type: Literal["TaskFailed"] = "TaskFailed"
    task_id: TaskId
    error_type: StreamErrorType | str
    error_message: str


class TaskDeleted(_EventBase):
    type: Literal["TaskDeleted"] = "TaskDeleted"
    task_id: TaskId


# -- downloads ------------------------------------------------------------------------------


class _DownloadEventBase(_EventBase):
    node_id: NodeId
    model_id: ModelId
    attempt_id: DownloadAttemptId


class DownloadPending(_DownloadEventBase):
    """An ordered start/reset decision; clears an older terminal outcome."""

    type: Literal["DownloadPending"] = "DownloadPending"


class DownloadOngoing(_DownloadEventBase):
    """Decodable for replay compatibility only: progress now rides telemetry
    (`DownloadProgress`) and this event does not change State."""

    type: Literal["DownloadOngoing"] = "DownloadOngoing"
    downloaded_bytes: NonNegInt
    total_bytes: NonNegInt


class DownloadCompleted(_DownloadEventBase):
    type: Literal["DownloadCompleted"] = "DownloadCompleted"
    total_bytes: NonNegInt


class DownloadFailed(_DownloadEventBase):
    type: Literal["DownloadFailed"] = "DownloadFailed"
    error_message: str


# -- cluster-wide switches ----------------------------------------------------------------------


class TracingStateChanged(_EventBase):
    type: Literal["TracingStateChanged"] = "TracingStateChanged"
    enabled: bool


class StagedModelEvicted(_EventBase):
    """Every named node (all nodes when `node_ids` is None) dropped its staged copy."""

    type: Literal["StagedModelEvicted"] = "StagedModelEvicted"
    model_id: ModelId
    node_ids: list[NodeId] | None = None


# -- custom model cards -----------------------------------------------------------------------


class CustomModelCardAdded(_EventBase):
    """An operator added (or replaced) a custom card; every node writes it to its own
    custom cards directory so any node's API can resolve the model."""

    type: Literal["CustomModelCardAdded"] = "CustomModelCardAdded"
    card: ModelCard


class CustomModelCardDeleted(_EventBase):
    type: Literal["CustomModelCardDeleted"] = "CustomModelCardDeleted"
    model_id: ModelId


Event = Annotated[
    NodeJoined | NodeLeft | NodeTimedOut | NodeNetworkUpdated | TopologyEdgeCreated | TopologyEdgeDeleted | InstanceCreated | InstanceDeleted | InstancePlacementRefused | InstanceRepairAbandoned | RunnerStatusUpdated | RunnerDeleted | TaskCreated | TaskAcknowledged | TaskStatusUpdated | TaskFailed | TaskDeleted | DownloadPending | DownloadOngoing | DownloadCompleted | DownloadFailed | TracingStateChanged | StagedModelEvicted | CustomModelCardAdded | CustomModelCardDeleted,
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


class LocalEvent(WireModel):
    """An event as its producer publishes it, before the master orders it. The master
    dedups on (origin, origin_session, origin_seq); a producer restart is a new session."""

    origin: NodeId
    origin_session: SessionId
    origin_seq: NonNegInt
    event: Event


class IndexedEvent(WireModel):
    """An event the master has ordered: `idx` is its position in the one cluster log.

    `origin_session`/`origin_seq` echo the producer's LocalEvent coordinates so a producer
    can see which of its events were confirmed (and a new master can rebuild its dedup
    floor from the log). The master's own decisions carry neither. When unset they are left
    off the wire entirely, so records written before they existed keep identical bytes.
    """

    idx: NonNegInt
    origin: NodeId
    indexed_at: UtcDatetime
    event: Event
    origin_session: SessionId | None = None
    origin_seq: NonNegInt | None = None

    @model_serializer(mode="wrap")
    def _omit_unset_origin(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for key in ("origin_session", "originSession", "origin_seq", "originSeq"):
            if key in data and data[key] is None:
                del data[key]
        return data


__all__ = [
    "EVENT_ADAPTER",
    "CustomModelCardAdded",
    "CustomModelCardDeleted",
    "DownloadCompleted",
    "DownloadFailed",
    "DownloadOngoing",
    "DownloadPending",
    "Edge",
    "Event",
    "IndexedEvent",
    "InstanceCreated",
    "InstanceDeleted",
    "InstancePlacementRefused",
    "InstanceRepairAbandoned",
    "LocalEvent",
    "NetworkInterface",
    "NodeJoined",
    "NodeLeft",
    "NodeNetworkUpdated",
    "NodeTimedOut",
    "RunnerDeleted",
    "RunnerStatusUpdated",
    "StagedModelEvicted",
    "TaskAcknowledged",
    "TaskCreated",
    "TaskDeleted",
    "TaskFailed",
    "TaskStatusUpdated",
    "TopologyEdgeCreated",
    "TopologyEdgeDeleted",
    "TracingStateChanged",
]
