"""Placed instances: which runner on which node serves which layers of a model.

The master decides an `Instance` once (placement is a pure function over replicated state)
and stamps on it everything every rank must agree on, such as `context_token_limit`, so no
rank ever recomputes it from time-varying telemetry. Types only; no placement logic here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from skulk.shared.types.base import WireModel
from skulk.shared.types.common import NonNegInt, RunnerState, Sharding
from skulk.shared.types.ids import CommandId, InstanceId, ModelId, NodeId, RunnerId
from skulk.shared.types.kv_cache import DEFAULT_KV_CACHE_TYPE, KvCacheType

MAX_REPAIR_HOP = 2
"""Bound on automatic re-placement after a refusal: 0 is the original placement, 1 the
one-node-wider re-placement, 2 the single-node fallback. A refusal at hop 2 is terminal, so
the chain can never oscillate between two refusing nodes. The same bound stops the other
repairs that add a hop: a group that keeps breaking, and a runner its worker keeps giving
up on (`skulk.master.repair.repair_given_up`)."""


class ShardAssignment(WireModel):
    """One rank of an instance: layers [start_layer, end_layer) on one node's runner."""

    node_id: NodeId
    runner_id: RunnerId
    rank: NonNegInt
    world_size: int = Field(ge=1)
    start_layer: NonNegInt
    end_layer: NonNegInt
    backend: str
    slots: int = Field(default=1, ge=1, le=256)
    """Requests this rank's engine decodes at once (a served engine's slots, 1 in-process),
    stamped by placement after the KV cache for every slot was admitted; the runner launches
    the server with exactly this many (`skulk.shared.slots`)."""
    slots_wanted: int | None = Field(default=None, ge=1, le=256)
    """The node's slot setting when placement had to reduce `slots` to what fits in memory;
    None when the setting was granted."""
    kv_cache_type: KvCacheType = DEFAULT_KV_CACHE_TYPE
    """The KV cache element type placement admitted this rank's cache as (every rank of an
    instance has the same); the engine loads its cache as that type."""

    @model_validator(mode="after")
    def _consistent(self) -> ShardAssignment:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        if self.end_layer <= self.start_layer:
            raise ValueError(
                f"empty layer range [{self.start_layer}, {self.end_layer}) for rank {self.rank}"
            )
        return self


class ShardCapacity(WireModel):
    """The capacity planner's answer for one rank on its node, at placement time."""

    node_id: NodeId
    rank: NonNegInt
    device_kind: Literal["ram", "vram"]
    layers: NonNegInt
    """Layers this rank holds."""
    gpu_layers: NonNegInt
    """Of those, layers resident on the device (llama.cpp's n_gpu_layers on a VRAM device)."""
    hot_kv_tokens: NonNegInt
    effective_context_tokens: NonNegInt
    planner_effective_context_tokens: NonNegInt
    shortfall: str | None = None
    """Why even the minimum hot context does not fit (then the token counts are 0)."""
    admitted_bytes: NonNegInt = 0
    """The footprint placement admitted this rank with on its node (weight share x overhead
    + its layers' KV at the admission context + the floor): each rank's memory, in State,
    also for every member of a llama.cpp pool."""


class InstanceCapacity(WireModel):
    """The capacity planner's outputs for a placement (`skulk.capacity.instance`): the
    instance serves what its tightest rank can, so the token counts are minima over ranks."""

    effective_context_tokens: NonNegInt
    hot_kv_tokens: NonNegInt
    planner_effective_context_tokens: NonNegInt
    gpu_layers: NonNegInt
    """Layers resident on accelerator devices, summed over ranks (every layer on RAM devices)."""
    num_layers: NonNegInt
    shards: list[ShardCapacity] = Field(default_factory=list)
    cold_budget_bytes: NonNegInt = 0
    """Host-RAM bytes per runner for cold KV prefixes the policy planned (0: the node's
    setting or default applies, `skulk.shared.prefix_cache.cold_budget_bytes`)."""


class Instance(WireModel):
    instance_id: InstanceId
    model_id: ModelId
    sharding: Sharding
    shards: list[ShardAssignment] = Field(min_length=1)
    excluded_nodes: list[NodeId] = Field(default_factory=list)
    context_token_limit: int = Field(ge=1)
    ring_hosts: list[str] = Field(default_factory=list)
    repair_hop: int = Field(default=0, ge=0, le=MAX_REPAIR_HOP)
    created_by_command: CommandId | None = None
    capacity: InstanceCapacity | None = None
    """The capacity planner's view at placement (what `context_token_limit` was derived
    from); None for instances placed without it."""
    idle_ttl_s: float | None = Field(default=None, gt=0)
    """Seconds a runner of this instance may sit idle before it unloads its model (it
    reloads on the next request); None: it stays loaded (`skulk.shared.residency`)."""
    requested_slots: int | None = Field(default=None, ge=1, le=256)
    """The operator's slot count for this placement (`POST /place_instance` `slots`);
    repairs place it again with the same count. None: each node's slot setting."""

    @model_validator(mode="after")
    def _ranks_in_order(self) -> Instance:
        # Every rank must see the same ordered group, or collectives deadlock.
        n = len(self.shards)
        for position, shard in enumerate(self.shards):
            if shard.rank != position or shard.world_size != n:
                raise ValueError(
                    f"shards must be ordered by rank 0..{n - 1} with world_size {n}; "
                    f"position {position} has rank {shard.rank}, world_size {shard.world_size}"
                )
        runner_ids = [s.runner_id for s in self.shards]
        if len(set(runner_ids)) != n:
            raise ValueError("each shard needs its own runner id")
        return self

    def runner_ids(self) -> list[RunnerId]:
        return [s.runner_id for s in self.shards]

    def node_ids(self) -> list[NodeId]:
        """Hosting nodes in rank order (a node may host several ranks)."""
        return [s.node_id for s in self.shards]

    def shard_for_runner(self, runner_id: RunnerId) -> ShardAssignment | None:
        return next((s for s in self.shards if s.runner_id == runner_id), None)


class RunnerStatus(WireModel):
    state: RunnerState
    error_message: str | None = None
    served: bool = False
    """The runner had reached Ready before this status. On a Failed status of a multi-rank
    instance it means the group broke while serving: the rank is not restarted (it could
    never rejoin the formed group) and the master re-places the group."""
    gave_up: bool = False
    """On a Failed status: the worker will not restart this runner (its crash breaker
    tripped, or it was a rank of a group that broke while serving). The master re-places
    the instance away from this node (`skulk.master.repair.repair_given_up`); until then,
    and for good when no other node admits it, requests are refused with this status."""


__all__ = ["MAX_REPAIR_HOP", "Instance", "InstanceCapacity", "RunnerStatus", "ShardAssignment", "ShardCapacity"]
