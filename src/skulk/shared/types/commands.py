"""Commands: imperative requests to the master (or, for downloads, to a target worker).

A command is a wish, not a fact: the master validates it against replicated state and
answers with events (or refuses). Commands are never applied to State and never replayed.
Every command carries a `command_id` minted by the shell that sends it; API commands reuse
it as the id of their data-plane stream.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from skulk.shared.types.base import WireModel
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.common import NonNegInt, Sharding
from skulk.shared.types.ids import CommandId, InstanceId, ModelId, NodeId
from skulk.shared.types.instances import Instance
from skulk.shared.types.kv_cache import DEFAULT_KV_CACHE_TYPE, KvCacheType
from skulk.shared.types.tasks import TextGenerationParams
from skulk.shared.types.workload_io import OneResultParams


class _CommandBase(WireModel):
    command_id: CommandId


class PlaceInstance(_CommandBase):
    """Ask the master to choose a placement. `excluded_nodes` is a per-launch hint that is
    stamped onto the resulting instance so repairs keep honouring it."""

    type: Literal["PlaceInstance"] = "PlaceInstance"
    model_id: ModelId
    instance_id: InstanceId | None = None
    """Chosen by the API that dry-ran the placement, so it can answer with the id at once."""
    sharding: Sharding = "Pipeline"
    min_nodes: int = Field(default=1, ge=1)
    excluded_nodes: list[NodeId] = Field(default_factory=list)
    idle_ttl_s: float | None = Field(default=None, gt=0)
    """Stamped onto the instance: its runners unload after this long idle (None: never)."""
    slots: int | None = None
    """The operator's slot count for a served engine (None: the node's setting); checked by
    placement, which refuses a bad one as `invalid_slot_setting`."""
    kv_cache_type: KvCacheType | None = None
    """The placement's KV cache type (None: the card's `runtime.kv_cache_backend`, else
    `default_kv_cache_type`); placement refuses one no engine of the card serves."""
    default_kv_cache_type: KvCacheType = DEFAULT_KV_CACHE_TYPE
    """The placing node's own default (skulk.yaml `kv_cache_backend`)."""


class CreateInstance(_CommandBase):
    """Create an instance whose placement the caller already decided (e.g. a dry run)."""

    type: Literal["CreateInstance"] = "CreateInstance"
    instance: Instance


class DeleteInstance(_CommandBase):
    type: Literal["DeleteInstance"] = "DeleteInstance"
    instance_id: InstanceId


class GenerateText(_CommandBase):
    type: Literal["GenerateText"] = "GenerateText"
    params: TextGenerationParams
    traced: bool = False
    """Record this request's spans on every node it crosses (tracing was on when it came
    in); the trace id is the command id."""


class RunWorkload(_CommandBase):
    """Run a one-result workload (embeddings, echo) on a placed instance of its model."""

    type: Literal["RunWorkload"] = "RunWorkload"
    params: OneResultParams


class TaskFinished(_CommandBase):
    """The owning API saw the terminal frame of `finished_command_id`; its task may go."""

    type: Literal["TaskFinished"] = "TaskFinished"
    finished_command_id: CommandId


class CancelCommand(_CommandBase):
    type: Literal["CancelCommand"] = "CancelCommand"
    cancelled_command_id: CommandId


class SetTracingEnabled(_CommandBase):
    type: Literal["SetTracingEnabled"] = "SetTracingEnabled"
    enabled: bool


class RefuseInstancePlacement(_CommandBase):
    """A worker's pre-load memory guard refused its shard of `instance_id`."""

    type: Literal["RefuseInstancePlacement"] = "RefuseInstancePlacement"
    instance_id: InstanceId
    node_id: NodeId
    needed_bytes: NonNegInt
    available_bytes: NonNegInt
    message: str


class EvictStagedModel(_CommandBase):
    type: Literal["EvictStagedModel"] = "EvictStagedModel"
    model_id: ModelId


class RequestEventLog(_CommandBase):
    """A follower asks for retained events with idx >= `since_idx` (its
    `last_event_applied_idx + 1`)."""

    type: Literal["RequestEventLog"] = "RequestEventLog"
    since_idx: NonNegInt


class StartDownload(_CommandBase):
    type: Literal["StartDownload"] = "StartDownload"
    target_node_id: NodeId
    model_id: ModelId


class CancelDownload(_CommandBase):
    type: Literal["CancelDownload"] = "CancelDownload"
    target_node_id: NodeId
    model_id: ModelId


class AddCustomModelCard(_CommandBase):
    type: Literal["AddCustomModelCard"] = "AddCustomModelCard"
    card: ModelCard


class DeleteCustomModelCard(_CommandBase):
    type: Literal["DeleteCustomModelCard"] = "DeleteCustomModelCard"
    model_id: ModelId


Command = Annotated[
    PlaceInstance | CreateInstance | AddCustomModelCard | DeleteCustomModelCard | DeleteInstance | GenerateText | RunWorkload | TaskFinished | CancelCommand | SetTracingEnabled | RefuseInstancePlacement | EvictStagedModel | RequestEventLog | StartDownload | CancelDownload,
    Field(discriminator="type"),
]
COMMAND_ADAPTER: TypeAdapter[Command] = TypeAdapter(Command)


class ForwarderCommand(WireModel):
    """A command as it travels on the COMMANDS topic, with the node that sent it (the node
    whose API owns the resulting stream)."""

    origin: NodeId
    command: Command


__all__ = [
    "COMMAND_ADAPTER",
    "AddCustomModelCard",
    "CancelCommand",
    "CancelDownload",
    "Command",
    "CreateInstance",
    "DeleteCustomModelCard",
    "DeleteInstance",
    "EvictStagedModel",
    "ForwarderCommand",
    "GenerateText",
    "PlaceInstance",
    "RefuseInstancePlacement",
    "RequestEventLog",
    "RunWorkload",
    "SetTracingEnabled",
    "StartDownload",
    "TaskFinished",
]
