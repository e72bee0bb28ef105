"""The capacity planner applied to a placement: per-rank plans and the window to stamp.

Placement (`skulk.master.placement`) calls `plan_instance` with each hosting node's memory
snapshot (the same available figure, plus any master credit, that it admitted the shards
against) and stamps the result on the Instance next to `context_token_limit`, which
`stamped_context_tokens` derives from it. The master computes both once, so every rank
admits a request identically even though the snapshot is a live reading.

The window is the planner's effective context (what fits *now*, after the OS reserve and
headroom), bounded by the static rules of `skulk.shared.memory_estimate`: engines that commit
their whole window at load keep the admission floor unless it lands in discrete VRAM, vLLM
is capped, and nothing exceeds the card's context. It never drops below the admission
floor: placement already admitted every shard with that much KV reserved.

Pure: cards, shard assignments and snapshots in, data out. Never reads telemetry itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TypedDict

from skulk.capacity.planner import (
    CapacityPlan,
    CapacityPolicy,
    DeviceSnapshot,
    ModelMeta,
    model_meta_from_card,
    plan_capacity,
)
from skulk.shared.memory_estimate import (
    NodeMemoryTotals,
    admission_context_tokens,
    assignment_footprint,
    assignment_share,
    instance_context_token_limit,
)
from skulk.shared.slots import kv_copies
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.ids import NodeId
from skulk.shared.types.instances import InstanceCapacity, ShardAssignment, ShardCapacity

DEFAULT_POLICY = CapacityPolicy()


def plan_instance(
    card: ModelCard,
    shards: Sequence[ShardAssignment],
    devices: Mapping[NodeId, DeviceSnapshot],
    policy: CapacityPolicy = DEFAULT_POLICY,
) -> InstanceCapacity:
    """Each rank planned on its node's device (a node hosting several ranks splits its free
    memory evenly between them); the instance's figures are the tightest rank's."""
    meta = model_meta_from_card(card)
    ranks_on: dict[NodeId, int] = {}
    for shard in shards:
        ranks_on[shard.node_id] = ranks_on.get(shard.node_id, 0) + 1
    planned = [
        _plan_shard(card, meta, shard, devices.get(shard.node_id), ranks_on[shard.node_id], policy) for shard in shards
    ]
    return InstanceCapacity(
        effective_context_tokens=min(p.effective_context_tokens for p in planned),
        hot_kv_tokens=min(p.hot_kv_tokens for p in planned),
        planner_effective_context_tokens=min(p.planner_effective_context_tokens for p in planned),
        gpu_layers=sum(p.gpu_layers for p in planned),
        num_layers=card.num_layers,
        shards=planned,
        cold_budget_bytes=policy.cold_budget_bytes,
    )


def stamped_context_tokens(
    card: ModelCard,
    shards: Sequence[ShardAssignment],
    totals: Mapping[NodeId, NodeMemoryTotals],
    capacity: InstanceCapacity,
) -> int:
    """`context_token_limit` for the Instance: the planner's effective context within the
    static bounds, never below the admission floor."""
    static = instance_context_token_limit(card, shards, totals)
    return max(admission_context_tokens(card), min(static, capacity.effective_context_tokens))


class _ShardBase(TypedDict):
    """The fields of a ShardCapacity that do not depend on the plan's outcome."""

    node_id: NodeId
    rank: int
    layers: int
    admitted_bytes: int


def _plan_shard(
    card: ModelCard, meta: ModelMeta, shard: ShardAssignment, device: DeviceSnapshot | None, ranks_on_node: int,
    policy: CapacityPolicy,
) -> ShardCapacity:
    layers, share = assignment_share(card, shard)
    admitted = assignment_footprint(card, shard)
    base = _ShardBase(node_id=shard.node_id, rank=shard.rank, layers=len(layers), admitted_bytes=admitted.total_bytes)
    if device is None:
        return ShardCapacity(**base, device_kind="ram", gpu_layers=0, hot_kv_tokens=0, effective_context_tokens=0,
                             planner_effective_context_tokens=0, shortfall="no memory reading for the node")
    if ranks_on_node > 1:
        device = DeviceSnapshot(device.kind, device.total_bytes, device.free_bytes // ranks_on_node)
    policy = replace(policy, kv_cache_type=shard.kv_cache_type)
    result = plan_capacity(meta, device, policy, layers=layers, share=share,
                           kv_copies=kv_copies(shard.backend, shard.slots), resident_bytes=admitted.projector_bytes)
    if not isinstance(result, CapacityPlan):
        return ShardCapacity(**base, device_kind=device.kind, gpu_layers=0, hot_kv_tokens=0,
                             effective_context_tokens=0, planner_effective_context_tokens=0,
                             shortfall=result.describe())
    return ShardCapacity(
        **base,
        device_kind=result.device_kind,
        gpu_layers=result.gpu_layers,
        hot_kv_tokens=result.hot_kv_tokens,
        effective_context_tokens=result.effective_context_tokens,
        planner_effective_context_tokens=result.planner_effective_context_tokens,
    )


__all__ = ["DEFAULT_POLICY", "plan_instance", "stamped_context_tokens"]
