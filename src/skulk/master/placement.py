"""Placement: which nodes serve which layers of a model, decided once by the master.

`place(card, state, resources, request, new_id=...)` returns an `Instance` or raises a typed
`PlacementError`; `preview(...)` lists every feasible placement, best first, for the API's
dry run and the dashboard's launch modal. Both are pure: replicated State plus the latest
gossiped NodeResources in, data out. Ids come from the injected `new_id`; no clock, no I/O.

The rules, in the order they apply:

1. Candidates are cluster members (state.nodes) with a NodeResources reading, minus the
   request's excluded nodes.
2. The card's compatible_backends must intersect a node's advertised backends (hard
   filter). A node serves with the first tag of `serving_order(card)` it advertises (the
   card's order, llama_server before in-process llama_cpp: `skulk.master.backend_choice`).
3. Node sets are tried from `min_nodes` up to every candidate. A multi-node set needs one
   engine that can span nodes (MULTI_NODE_ENGINES) and a rank order in which consecutive
   ranks share an edge (either kind, either direction). In a multi-node set each node
   serves with the first tag of the card's order whose engine can span nodes with this
   family and sharding (a GGUF pool uses llama_cpp-* even where llama_server ranks first
   for one node). Mixed compute variants are admitted in a llama.cpp pool (a CPU donor
   under a CUDA driver): each ggml RPC server computes its layers with its own backend,
   and the driver only ships tensors and graphs. A pooled GGUF instance is therefore the
   automatic answer when no single node admits the model, or what `min_nodes > 1` asks.
4. Shards: Pipeline gives each rank layers in proportion to its available memory (largest
   remainder, at least one layer each, no boundary beyond max_pipeline_split_layer);
   Tensor splits the weights evenly, only where the card supports it and the world size
   divides the attention and KV heads.
5. Memory admission is per node: each shard's footprint (`skulk.shared.memory_estimate`)
   must be strictly below the node's available memory plus any master credit; an exact fit
   thrashes and is refused. A served engine's shard holds KV for each of its slots (the
   node's advertised setting, `skulk.shared.slots`); when that many do not fit, the shard
   gets the most that do (`slots_wanted` records the setting), and with not even one it is
   a shortfall like any other. The granted count is stamped on the shard assignment.
   An operator may choose one placement's slots (`PlacementRequest.slots`): then the
   instance is one node serving with a served engine that has slots (the first such tag
   of the card's order the node advertises), the count within that engine's bound, and
   KV for exactly that many must fit; otherwise `InvalidSlotSetting` names the bound that
   was broken (engine, range, or the most slots each node's memory admits).
6. Best first: fewest nodes, then the best backend_preference rank (a set ranks by its
   worst shard), then the most headroom on its tightest node, then node ids.

When nothing fits, `_diagnose` explains why with the first rule that applies (see there):
PlacementInfoPending (retryable, HTTP 503) when the answer may change once gossip settles,
otherwise a 400-class error carrying the numbers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from types import MappingProxyType
from typing import ClassVar

from skulk.capacity.instance import plan_instance, stamped_context_tokens
from skulk.master.backend_choice import serving_order
from skulk.master.ring_hosts import ring_hosts_for
from skulk.master.vram import discrete_vram_bytes, shard_device
from skulk.shared.kv_shape import value_dim
from skulk.shared.memory_estimate import (
    Footprint,
    NodeMemoryTotals,
    ShardShare,
    admission_context_tokens,
    format_gb,
    shard_footprint,
)
from skulk.shared.slots import (
    MAX_SLOTS,
    SLOT_SETTING_ENV,
    engine_slots,
    kv_copies,
    requested_slots_refusal,
    slotted,
)
from skulk.shared.types.base import WireModel
from skulk.shared.types.cards import ModelCard, backend_engine
from skulk.shared.types.commands import PlaceInstance
from skulk.shared.types.common import Sharding
from skulk.shared.types.engines import MULTI_NODE_ENGINES, loads_family, shards_model, spans_with, traits_of
from skulk.shared.types.ids import InstanceId, ModelId, NodeId, RunnerId
from skulk.shared.types.instances import Instance, InstanceCapacity, ShardAssignment
from skulk.shared.types.kv_cache import (
    DEFAULT_KV_CACHE_TYPE,
    KvCacheType,
    chosen_kv_cache_type,
    kv_cache_type_refusal,
)
from skulk.shared.types.speculative import speculative_refusal
from skulk.shared.types.state import State
from skulk.shared.types.telemetry import NodeResources

"""Engines whose runners can split one model across nodes (MULTI_NODE_ENGINES): MLX
(pipeline ring, tensor) and the in-process llama.cpp runner (RPC memory pooling, layer
ranges: rank 0 drives, the others lend memory). llama-server, vLLM and the speech engines serve
single-node in this build."""

MAX_SETS_PER_SIZE = 4096
"""Bound on the node sets examined per world size (combinations in node-id order). Exact
for clusters up to 14 nodes; beyond that placement stays fast and deterministic but may miss
an exotic set."""

MAX_PATH_STEPS = 20_000
"""Bound on the search for a rank order whose consecutive ranks are connected. A set whose
order is not found within it counts as disconnected."""

EMPTY_CREDITS: Mapping[NodeId, int] = MappingProxyType({})


# ---------------------------------------------------------------------------------------
# Request and errors
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlacementRequest:
    model_id: ModelId
    sharding: Sharding = "Pipeline"
    min_nodes: int = 1
    excluded_nodes: frozenset[NodeId] = frozenset()
    max_nodes: int | None = None
    """Largest world size to try; None means every candidate. Repairs use it to pin a
    single-node fallback or a same-width re-placement."""
    slots: int | None = None
    """The operator's slot count for this placement (None: each node's setting). Exact:
    never reduced to fit; what cannot hold it is refused (`InvalidSlotSetting`)."""
    kv_cache_type: str | None = None
    """The placement's KV cache type (None: the card's, else `default_kv_cache_type`)."""
    default_kv_cache_type: str = DEFAULT_KV_CACHE_TYPE

    @classmethod
    def from_command(cls, command: PlaceInstance) -> PlacementRequest:
        return cls(
            model_id=command.model_id,
            sharding=command.sharding,
            min_nodes=command.min_nodes,
            excluded_nodes=frozenset(command.excluded_nodes),
            slots=command.slots,
            kv_cache_type=command.kv_cache_type,
            default_kv_cache_type=command.default_kv_cache_type,
        )

    def kv_type(self, card: ModelCard) -> KvCacheType:
        """The KV cache type this request places `card` with (`chosen_kv_cache_type`)."""
        return chosen_kv_cache_type(self.kv_cache_type, card.runtime.kv_cache_backend, self.default_kv_cache_type)


class PlacementError(Exception):
    """Why a model cannot be placed. `code` is stable; `message` is for people. Retryable
    errors (HTTP 503) may clear on their own once gossip settles; the rest are 400s."""

    code: ClassVar[str] = "placement_failed"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def http_status(self) -> int:
        return 503 if self.retryable else 400

    def __str__(self) -> str:
        return self.message


class ModelUnknown(PlacementError):
    code = "model_unknown"

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        super().__init__(f"no model card for {model_id!r}")


class ShardingUnsupported(PlacementError):
    """The card or the engines cannot be sharded the way the request asks."""

    code = "sharding_unsupported"

    def __init__(self, model_id: str, sharding: Sharding, reason: str) -> None:
        self.model_id, self.sharding, self.reason = model_id, sharding, reason
        super().__init__(f"{model_id} cannot be placed with {sharding} sharding: {reason}")


class FamilyUnsupported(PlacementError):
    """None of the card's engines can load its model family (the engine traits table)."""

    code = "family_unsupported"

    def __init__(self, model_id: str, family: str, engines: Sequence[str]) -> None:
        self.model_id, self.family, self.engines = model_id, family, tuple(engines)
        super().__init__(
            f"{model_id} is a {family!r} model, which none of its engines {list(self.engines)} can load yet; "
            "placing it would only fail when the runner loads it"
        )


class ExclusionsRemovedAll(PlacementError):
    code = "exclusions_removed_all"

    def __init__(self, excluded: Sequence[NodeId], members: Sequence[NodeId]) -> None:
        self.excluded, self.members = tuple(excluded), tuple(members)
        super().__init__(
            f"excluded nodes {list(self.excluded)} remove every cluster member {list(self.members)}; "
            "exclude fewer nodes"
        )


class NoCompatibleBackend(PlacementError):
    code = "no_compatible_backend"

    def __init__(
        self, model_id: str, card_backends: Sequence[str], node_backends: Mapping[NodeId, Sequence[str]],
        narrowed_by: str | None = None,
    ) -> None:
        """`narrowed_by`: the runtime choices that left only `card_backends` of the card's tags."""
        self.model_id = model_id
        self.card_backends = tuple(card_backends)
        self.node_backends = {n: tuple(b) for n, b in node_backends.items()}
        nodes = "; ".join(f"{n}: {list(b) or 'none'}" for n, b in self.node_backends.items())
        why = f" (for {narrowed_by})" if narrowed_by else ""
        super().__init__(
            f"no node can run {model_id}: it needs one of {list(self.card_backends)}{why}, nodes advertise {nodes}"
        )


class TopologyGap(PlacementError):
    """No connected node set of the needed size exists among the candidates."""

    code = "topology_gap"

    def __init__(self, needed_nodes: int, candidates: Sequence[NodeId], detail: str) -> None:
        self.needed_nodes, self.candidates, self.detail = needed_nodes, tuple(candidates), detail
        super().__init__(f"no connected set of {needed_nodes} node(s) among {list(self.candidates)}: {detail}")


@dataclass(frozen=True)
class NodeShortfall:
    node_id: NodeId
    needed_bytes: int
    available_bytes: int
    arithmetic: str
    """'weights 1.20 GB x 1.15 + KV 0.30 GB (8192 tokens) + floor 0.54 GB = 2.22 GB > 1.90 GB available'."""


class MemoryShortfall(PlacementError):
    """The closest-to-fitting attempt, with every node that could not hold its share."""

    code = "memory_shortfall"

    def __init__(
        self, model_id: str, sharding: Sharding, node_ids: Sequence[NodeId], shortfalls: Sequence[NodeShortfall]
    ) -> None:
        self.model_id, self.sharding = model_id, sharding
        self.node_ids, self.shortfalls = tuple(node_ids), tuple(shortfalls)
        details = "; ".join(f"{s.node_id}: {s.arithmetic}" for s in self.shortfalls)
        super().__init__(
            f"{model_id} does not fit ({sharding} over {list(self.node_ids)}): {details}"
        )


class InvalidSlotSetting(PlacementError):
    """A placement's requested slot count that no candidate can serve: an engine without
    slots, a count outside the engine's bound, or KV for that many slots that does not fit
    (each node's reason names the bound, e.g. the most slots its memory admits)."""

    code = "invalid_slot_setting"

    def __init__(self, model_id: str, slots: int, reasons: Sequence[str]) -> None:
        self.model_id, self.slots, self.reasons = model_id, slots, tuple(reasons)
        super().__init__(f"{model_id} cannot be placed with {slots} slots: {'; '.join(self.reasons)}")


class KvCacheTypeUnsupported(PlacementError):
    """A KV cache type none of the card's engines can hold (MLX and vLLM serve f16 here; a
    quantized V cache needs llama.cpp's flash attention, which a card may pin off)."""

    code = "kv_cache_type_unsupported"

    def __init__(self, model_id: str, kv_type: str, reasons: Sequence[str]) -> None:
        self.model_id, self.kv_type, self.reasons = model_id, kv_type, tuple(reasons)
        super().__init__(f"{model_id} cannot be placed with a {kv_type} KV cache: {'; '.join(self.reasons)}")


class SpeculativeUnsupported(PlacementError):
    """A card's speculative method (`runtime.speculative`) none of its engines serves."""

    code = "speculative_unsupported"

    def __init__(self, model_id: str, method: str, reasons: Sequence[str]) -> None:
        self.model_id, self.method, self.reasons = model_id, method, tuple(reasons)
        super().__init__(f"{model_id} asks for {method} speculative decoding: {'; '.join(self.reasons)}")


class PlacementInfoPending(PlacementError):
    """Cluster info has not finished gossiping (resources lagging members, or edges lagging
    members): retry shortly."""

    code = "placement_info_pending"
    retryable = True

    def __init__(self, reason: str, nodes: Sequence[NodeId] = ()) -> None:
        self.reason, self.nodes = reason, tuple(nodes)
        suffix = f" (nodes {list(self.nodes)})" if self.nodes else ""
        super().__init__(f"placement info pending: {reason}{suffix}; retry shortly")


# ---------------------------------------------------------------------------------------
# Preview (wire shape for the API)
# ---------------------------------------------------------------------------------------


class PreviewShard(WireModel):
    node_id: NodeId
    rank: int
    start_layer: int
    end_layer: int
    backend: str
    needed_bytes: int
    available_bytes: int
    slots: int = 1
    """Requests the engine decodes at once; `needed_bytes` holds KV for every slot."""
    slots_wanted: int | None = None
    """The node's slot setting when `slots` had to be reduced to fit memory."""
    projector_bytes: int = 0
    """Of `needed_bytes`, the vision card's multimodal projector this rank loads (rank 0)."""
    breakdown: str = ""
    """`needed_bytes` as its arithmetic: 'weights ... + KV ... (+ draft, + projector) + floor = ...'."""


class PlacementPreview(WireModel):
    model_id: ModelId
    sharding: Sharding
    node_ids: list[NodeId]
    """Hosting nodes in rank order."""
    shards: list[PreviewShard]
    context_token_limit: int
    capacity: InstanceCapacity
    """The capacity planner's outputs: effective context, hot KV tokens, GPU layers."""
    kv_cache_type: KvCacheType = DEFAULT_KV_CACHE_TYPE
    """The KV cache type the shards were admitted with (the window counts its size)."""


# ---------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------


def place(
    card: ModelCard | None,
    state: State,
    resources: Mapping[NodeId, NodeResources],
    request: PlacementRequest,
    *,
    new_id: Callable[[], str],
    memory_credits: Mapping[NodeId, int] = EMPTY_CREDITS,
) -> Instance:
    """The best placement for `request` as a new Instance, or a PlacementError. `card` None
    means the model is unknown. `memory_credits` adds bytes to a node's available memory
    (the master's grace credit for a just-deleted instance)."""
    if card is None:
        raise ModelUnknown(request.model_id)
    if card.model_id != request.model_id:
        raise ValueError(f"card {card.model_id!r} does not match request {request.model_id!r}")
    if not any(loads_family(engine, card.family) for engine in card.engines):
        raise FamilyUnsupported(card.model_id, card.family, sorted(card.engines))
    unsupported = _sharding_unsupported(card, request.sharding, request.min_nodes)
    if unsupported is not None:
        raise unsupported
    if request.slots is not None:
        _check_slot_request(card, request.slots, request.min_nodes)
    kv_type = request.kv_type(card)
    _check_runtime_choices(card, kv_type)
    search = _search(
        card,
        state,
        resources,
        request.sharding,
        request.min_nodes,
        request.excluded_nodes,
        memory_credits,
        first_fit_only=True,
        max_nodes=request.max_nodes,
        slots=request.slots,
        kv_type=kv_type,
    )
    if search.feasible:
        instance = _instantiate(card, resources, request, search.feasible[0], new_id)
        return instance.model_copy(update={"ring_hosts": ring_hosts_for(instance, state)})
    raise _diagnose(search)


def preview(
    card: ModelCard,
    state: State,
    resources: Mapping[NodeId, NodeResources],
    *,
    sharding: Sharding | None = None,
    excluded_nodes: frozenset[NodeId] = frozenset(),
    memory_credits: Mapping[NodeId, int] = EMPTY_CREDITS,
    slots: int | None = None,
    kv_cache_type: KvCacheType = DEFAULT_KV_CACHE_TYPE,
) -> list[PlacementPreview]:
    """Every feasible placement (both shardings unless one is given; then a one-node tensor
    option is left out as a duplicate of the pipeline one), best first. Empty when nothing
    fits; `place` says why. With `slots`, the placements that serve exactly that many
    (`InvalidSlotSetting` for a count no engine of the card takes)."""
    if slots is not None:
        _check_slot_request(card, slots, 1)
    _check_runtime_choices(card, kv_cache_type)
    options: list[_Option] = []
    for mode in ("Pipeline", "Tensor") if sharding is None else (sharding,):
        if _sharding_unsupported(card, mode, 1) is None:
            found = _search(card, state, resources, mode, 1, excluded_nodes, memory_credits, slots=slots,
                            kv_type=kv_cache_type).feasible
            # A one-rank tensor "split" is the pipeline placement again: list it once.
            options.extend(o for o in found if not (sharding is None and mode == "Tensor" and len(o.shards) == 1))
    options.sort(key=_Option.score)
    return [_to_preview(card, resources, option) for option in options]


# ---------------------------------------------------------------------------------------
# Shards: layer allocation and footprints
# ---------------------------------------------------------------------------------------


def allocate_layers(num_layers: int, weights: Sequence[int], max_split_layer: int | None = None) -> list[int] | None:
    """Layers per rank, proportional to `weights` (largest remainder, ties to the lower
    rank), at least one each, with every stage boundary at or before `max_split_layer`
    (boundaries move left: the last rank takes the excess). None when impossible: more
    ranks than layers, or more boundaries than the split limit allows."""
    n = len(weights)
    if n == 0 or n > num_layers or (max_split_layer is not None and n - 1 > max_split_layer):
        return None
    total = sum(max(w, 0) for w in weights)
    quotas = [Fraction(num_layers * max(w, 0), total) if total else Fraction(num_layers, n) for w in weights]
    counts = [int(q) for q in quotas]
    by_remainder = sorted(range(n), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[: num_layers - sum(counts)]:
        counts[i] += 1
    for i in range(n):
        while counts[i] == 0:  # every rank holds at least one layer; the biggest pays
            donor = max(range(n), key=lambda j: (counts[j], -j))
            counts[donor] -= 1
            counts[i] += 1
    if max_split_layer is not None and n > 1 and num_layers - counts[-1] > max_split_layer:
        # The last boundary sits past the limit: the front ranks share exactly the layers
        # before it (still in proportion) and the last rank takes the rest.
        front = allocate_layers(max_split_layer, weights[:-1])
        assert front is not None  # n - 1 <= max_split_layer was checked above
        counts = [*front, num_layers - max_split_layer]
    return counts


@dataclass(frozen=True)
class _Node:
    """One candidate's admission inputs."""

    node_id: NodeId
    backend: str
    backend_rank: int
    available_bytes: int
    """ram_available_bytes plus any master credit."""
    slots: int = 1
    """The node's slot setting for its backend's engine (`skulk.shared.slots.engine_slots`),
    or the placement's requested count."""
    fixed_slots: bool = False
    """`slots` was requested for this placement: KV for exactly that many, never fewer."""
    span_backend: str | None = None
    """The tag this node serves with as one rank of a multi-node set (the first tag of the
    card's order whose engine can span nodes with the family and sharding), or None."""
    span_rank: int = 0
    span_slots: int = 1

    def spanning(self) -> _Node | None:
        """This node as a rank of a multi-node set, or None when it cannot be one."""
        if self.span_backend is None:
            return None
        return replace(self, backend=self.span_backend, backend_rank=self.span_rank, slots=self.span_slots)


@dataclass(frozen=True)
class _Shard:
    node: _Node
    start_layer: int
    end_layer: int
    footprint: Footprint
    slots: int = 1
    """Slots granted: the node's setting, or fewer when KV for that many does not fit."""

    @property
    def slots_wanted(self) -> int | None:
        """The node's setting when it was reduced to fit, else None."""
        return self.node.slots if self.slots < self.node.slots else None

    @property
    def fits(self) -> bool:
        return self.footprint.total_bytes < self.node.available_bytes  # an exact fit thrashes

    @property
    def headroom_bytes(self) -> int:
        return self.node.available_bytes - self.footprint.total_bytes


@dataclass(frozen=True)
class _Option:
    sharding: Sharding
    shards: tuple[_Shard, ...]
    connected: bool
    kv_type: KvCacheType = DEFAULT_KV_CACHE_TYPE

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.shards)

    @property
    def node_ids(self) -> tuple[NodeId, ...]:
        return tuple(s.node.node_id for s in self.shards)

    def score(self) -> tuple[int, int, int, tuple[NodeId, ...], Sharding]:
        return (
            len(self.shards),
            max(s.node.backend_rank for s in self.shards),
            -min(s.headroom_bytes for s in self.shards),
            self.node_ids,
            self.sharding,
        )

    def worst_deficit(self) -> tuple[int, int, tuple[NodeId, ...]]:
        return (max(-s.headroom_bytes for s in self.shards), len(self.shards), self.node_ids)


def _build_option(card: ModelCard, sharding: Sharding, order: Sequence[_Node], connected: bool,
                  kv_type: KvCacheType = DEFAULT_KV_CACHE_TYPE) -> _Option | None:
    tokens = admission_context_tokens(card)
    n = len(order)
    if sharding == "Tensor":
        fraction = Fraction(1, n)
        shards = tuple(_Shard(node, 0, card.num_layers,
                              *_slotted_footprint(card, node, fraction, tokens, kv_type, loads_projector=rank == 0))
                       for rank, node in enumerate(order))
        return _Option(sharding, shards, connected, kv_type)
    weights = [node.available_bytes for node in order]
    counts = allocate_layers(card.num_layers, weights, card.placement.max_pipeline_split_layer)
    if counts is None:
        return None
    shards_list: list[_Shard] = []
    start = 0
    for node, count in zip(order, counts, strict=True):
        end = start + count
        shards_list.append(_Shard(node, start, end, *_slotted_footprint(card, node, range(start, end), tokens, kv_type)))
        start = end
    return _Option(sharding, tuple(shards_list), connected, kv_type)


def _slotted_footprint(card: ModelCard, node: _Node, share: ShardShare, tokens: int,
                       kv_type: KvCacheType = DEFAULT_KV_CACHE_TYPE,
                       loads_projector: bool | None = None) -> tuple[Footprint, int]:
    """The shard's footprint with KV for the node's slot setting and that many slots, or, when
    that does not fit, for the most slots that do (at least one: a shard that cannot hold
    one slot's context is a memory shortfall, its arithmetic naming context and slots)."""
    for slots in range(node.slots, 0, -1):
        footprint = shard_footprint(card, share, tokens, kv_copies(node.backend, slots), kv_type, loads_projector)
        if footprint.total_bytes < node.available_bytes or slots == 1 or node.fixed_slots:
            return footprint, slots
    raise AssertionError("unreachable: slots >= 1")


def _most_slots_fitting(card: ModelCard, shard: _Shard) -> int:
    """The most slots (up to the shard's) whose KV fits beside the shard's weights; 0 when
    not even one does."""
    share = range(shard.start_layer, shard.end_layer)
    tokens = admission_context_tokens(card)
    for slots in range(shard.slots, 0, -1):
        footprint = shard_footprint(card, share, tokens, kv_copies(shard.node.backend, slots), shard.footprint.kv_type,
                                    loads_projector=shard.footprint.projector_bytes > 0)
        if footprint.total_bytes < shard.node.available_bytes:
            return slots
    return 0


def _check_runtime_choices(card: ModelCard, kv_type: str) -> None:
    """`KvCacheTypeUnsupported` when no backend of the card can hold a `kv_type` cache, and
    `SpeculativeUnsupported` when none serves the card's speculative method."""
    method = card.runtime.speculative or "none"
    spec_refusals = [speculative_refusal(tag, method) for tag in card.placement.compatible_backends]
    if all(why is not None for why in spec_refusals):
        raise SpeculativeUnsupported(card.model_id, method, list(dict.fromkeys(filter(None, spec_refusals))))
    refusals = {tag: kv_cache_type_refusal(tag, kv_type, card.runtime.flash_attn, _head_dims(card))
                for tag in card.placement.compatible_backends if speculative_refusal(tag, method) is None}
    if all(why is not None for why in refusals.values()):
        raise KvCacheTypeUnsupported(card.model_id, kv_type, list(dict.fromkeys(filter(None, refusals.values()))))


def _head_dims(card: ModelCard) -> tuple[int, int]:
    """The card's key and value head widths (MLX quantizes its KV cache in groups along them)."""
    return card.head_dim, value_dim(card.head_dim, card.value_head_dim)


def speculates(card: ModelCard) -> bool:
    """Whether the card asks for speculative decoding (then it is placed on one node)."""
    return (card.runtime.speculative or "none") != "none"


def _runtime_refusal(card: ModelCard, tag: str, kv_type: str) -> str | None:
    """Why `tag` cannot serve the card's runtime choices (KV cache type, speculation), or None."""
    return (kv_cache_type_refusal(tag, kv_type, card.runtime.flash_attn, _head_dims(card))
            or speculative_refusal(tag, card.runtime.speculative or "none"))


def _check_slot_request(card: ModelCard, slots: int, min_nodes: int) -> None:
    """Refusals of a requested slot count that no cluster state can change."""
    served = [tag for tag in card.placement.compatible_backends if slotted(tag)]
    if not served:
        raise InvalidSlotSetting(card.model_id, slots, [
            f"none of its backends {list(card.placement.compatible_backends)} has slots "
            f"(slots apply to served engines: {sorted(SLOT_SETTING_ENV)})"])
    if min_nodes > 1:
        raise InvalidSlotSetting(card.model_id, slots, [
            f"min_nodes={min_nodes} asks for a multi-node instance, and engines with slots serve on one node"])
    bounds = {backend_engine(tag): MAX_SLOTS[backend_engine(tag)] for tag in served}
    if not any(1 <= slots <= bound for bound in bounds.values()):
        raise InvalidSlotSetting(card.model_id, slots, [
            ", ".join(f"{engine} takes 1..{bound}" for engine, bound in sorted(bounds.items()))])


# ---------------------------------------------------------------------------------------
# Search
# ---------------------------------------------------------------------------------------


@dataclass
class _Search:
    """Everything the search saw, kept so a failure can be explained."""

    card: ModelCard
    sharding: Sharding
    min_nodes: int
    excluded: frozenset[NodeId]
    members: list[NodeId] = field(default_factory=list)
    eligible: list[NodeId] = field(default_factory=list)
    pending: list[NodeId] = field(default_factory=list)
    """Eligible members without a NodeResources reading yet."""
    compatible: list[_Node] = field(default_factory=list)
    incompatible: dict[NodeId, tuple[str, ...]] = field(default_factory=dict)
    edge_lagging: list[NodeId] = field(default_factory=list)
    """Compatible members that no edge touches at all (their connectivity not reported yet)."""
    links: list[tuple[NodeId, NodeId]] = field(default_factory=list)
    """Undirected connections among compatible nodes, sorted (for messages)."""
    invalid_sizes: dict[int, str] = field(default_factory=dict)
    feasible: list[_Option] = field(default_factory=list)
    short_connected: list[_Option] = field(default_factory=list)
    short_disconnected: list[_Option] = field(default_factory=list)
    fit_but_disconnected: list[_Option] = field(default_factory=list)
    slots: int | None = None
    """The placement's requested slot count, if any."""
    slot_refused: dict[NodeId, str] = field(default_factory=dict)
    """Nodes left out because none of their backends can serve the requested slots."""
    kv_type: KvCacheType = DEFAULT_KV_CACHE_TYPE
    """The KV cache type every shard is admitted with; tags that cannot hold it are skipped."""
    tags: tuple[str, ...] = ()
    """The card's backend tags, best first, that can serve its runtime choices (KV cache
    type, speculation): the only ones a node is matched against."""


def _search(
    card: ModelCard,
    state: State,
    resources: Mapping[NodeId, NodeResources],
    sharding: Sharding,
    min_nodes: int,
    excluded: frozenset[NodeId],
    credits: Mapping[NodeId, int],
    *,
    first_fit_only: bool = False,
    max_nodes: int | None = None,
    slots: int | None = None,
    kv_type: KvCacheType = DEFAULT_KV_CACHE_TYPE,
) -> _Search:
    s = _Search(card=card, sharding=sharding, min_nodes=min_nodes, excluded=excluded, slots=slots, kv_type=kv_type)
    if slots is not None or speculates(card):
        max_nodes = 1  # engines with slots, and every drafting engine, serve on one node
    s.members = sorted(state.nodes)
    s.eligible = [n for n in s.members if n not in excluded]
    s.pending = [n for n in s.eligible if n not in resources]
    # llama_server before in-process llama_cpp, unless the card ranks it; only the tags
    # whose engine holds the placement's KV cache type and serves the card's speculation.
    ordered = s.tags = tuple(tag for tag in serving_order(card) if _runtime_refusal(card, tag, kv_type) is None)
    for node_id in (n for n in s.eligible if n in resources):
        reading = resources[node_id]
        backend = next((tag for tag in ordered if tag in reading.backends), None)
        if backend is None:
            s.incompatible[node_id] = tuple(reading.backends)
            continue
        available = reading.memory.ram_available_bytes + max(credits.get(node_id, 0), 0)
        if slots is not None:
            _consider_slotted(s, node_id, [tag for tag in ordered if tag in reading.backends], available, slots)
            continue
        span = next((tag for tag in ordered if tag in reading.backends
                     and shards_model(backend_engine(tag), card.family, "vision" in card.capabilities)
                     and spans_with(backend_engine(tag), sharding)), None)
        s.compatible.append(_Node(
            node_id, backend, ordered.index(backend), available,
            slots=engine_slots(backend, reading.engine_slots),
            span_backend=span, span_rank=ordered.index(span) if span is not None else 0,
            span_slots=engine_slots(span, reading.engine_slots) if span is not None else 1,
        ))
    if len(state.nodes) > 1:
        s.edge_lagging = [c.node_id for c in s.compatible if not any(e.touches(c.node_id) for e in state.edges)]
    adjacency = _adjacency(state, {c.node_id for c in s.compatible})
    s.links = sorted({(a, b) for a, near in adjacency.items() for b in near if a < b})
    largest = len(s.compatible) if max_nodes is None else min(max_nodes, len(s.compatible))
    for size in range(max(min_nodes, 1), largest + 1):
        reason = _invalid_world_size(card, sharding, size)
        if reason is not None:
            s.invalid_sizes[size] = reason
            continue
        for combo in itertools.islice(itertools.combinations(s.compatible, size), MAX_SETS_PER_SIZE):
            _consider(s, combo, adjacency)
        if first_fit_only and s.feasible:
            break
    s.feasible.sort(key=_Option.score)
    return s


def _consider_slotted(s: _Search, node_id: NodeId, tags: Sequence[str], available: int, slots: int) -> None:
    """A candidate for a placement with requested slots: its first backend (card order)
    that can serve them, as one node; or the reason none can."""
    refusals = {tag: requested_slots_refusal(tag, slots) for tag in tags}
    backend = next((tag for tag in tags if refusals[tag] is None), None)
    if backend is None:
        served = [tag for tag in tags if slotted(tag)]
        s.slot_refused[node_id] = (
            "; ".join(dict.fromkeys(refusals[tag] or "" for tag in served)) if served else
            f"it serves this model with {list(tags)} only, which have no slots (in-process engines decode "
            f"one request at a time; slots apply to {' and '.join(sorted(SLOT_SETTING_ENV))})")
        return
    s.compatible.append(_Node(node_id, backend, tags.index(backend), available, slots=slots, fixed_slots=True))


def _consider(s: _Search, combo: tuple[_Node, ...], adjacency: Mapping[NodeId, frozenset[NodeId]]) -> None:
    if len(combo) > 1:
        spanning = tuple(node.spanning() for node in combo)
        if any(node is None for node in spanning):
            return  # a node without a spanning engine for this family and sharding
        combo = spanning  # type: ignore[assignment]
    engines = {backend_engine(node.backend) for node in combo}
    if not all(loads_family(e, s.card.family) for e in engines):
        return  # the engine cannot load this family: it would only fail at load
    if len(combo) > 1 and (len(engines) > 1 or not all(shards_model(e, s.card.family, "vision" in s.card.capabilities)
                                                         for e in engines)):
        return  # ranks of one instance share one engine that can span nodes with this family
    order = _connected_order(combo, adjacency) if len(combo) > 1 else combo
    connected = order is not None
    option = _build_option(s.card, s.sharding, order if order is not None else combo, connected, s.kv_type)
    if option is None:
        return
    if connected and option.fits:
        s.feasible.append(option)
    elif connected:
        s.short_connected.append(option)
    elif option.fits:
        s.fit_but_disconnected.append(option)
    else:
        s.short_disconnected.append(option)


def _adjacency(state: State, nodes: set[NodeId]) -> dict[NodeId, frozenset[NodeId]]:
    neighbours: dict[NodeId, set[NodeId]] = {n: set() for n in nodes}
    for edge in state.edges:  # either kind, either direction
        if edge.source in nodes and edge.sink in nodes:
            neighbours[edge.source].add(edge.sink)
            neighbours[edge.sink].add(edge.source)
    return {n: frozenset(v) for n, v in neighbours.items()}


def _connected_order(combo: Sequence[_Node], adjacency: Mapping[NodeId, frozenset[NodeId]]) -> tuple[_Node, ...] | None:
    """The first rank order (nodes tried in id order) in which every pair of consecutive
    ranks shares an edge, or None."""
    by_id = {node.node_id: node for node in combo}
    ids = sorted(by_id)
    steps = 0

    def extend(path: list[NodeId]) -> list[NodeId] | None:
        nonlocal steps
        if len(path) == len(ids):
            return path
        for nxt in ids:
            steps += 1
            if steps > MAX_PATH_STEPS:
                return None
            if nxt not in path and nxt in adjacency.get(path[-1], ()):
                found = extend([*path, nxt])
                if found is not None:
                    return found
        return None

    for first in ids:
        path = extend([first])
        if path is not None:
            return tuple(by_id[n] for n in path)
    return None


def _sharding_unsupported(card: ModelCard, sharding: Sharding, min_nodes: int) -> ShardingUnsupported | None:
    """Card-level refusals that no cluster state can change."""
    if sharding == "Tensor" and not card.placement.supports_tensor:
        return ShardingUnsupported(card.model_id, sharding, "the card does not support tensor parallelism")
    if min_nodes > 1 and speculates(card):
        return ShardingUnsupported(card.model_id, sharding, f"min_nodes={min_nodes} but the card speculates "
                                   f"({card.runtime.speculative}), which every engine does on one node")
    if min_nodes > 1 and not card.engines & MULTI_NODE_ENGINES:
        return ShardingUnsupported(
            card.model_id,
            sharding,
            f"min_nodes={min_nodes} but its engines {sorted(card.engines)} serve on a single node "
            f"(multi-node engines: {sorted(MULTI_NODE_ENGINES)})",
        )
    spanning = sorted(e for e in card.engines & MULTI_NODE_ENGINES
                      if shards_model(e, card.family, "vision" in card.capabilities))
    if min_nodes > 1 and not spanning:
        return ShardingUnsupported(
            card.model_id,
            sharding,
            f"min_nodes={min_nodes} but {card.family!r} serves on one node here: "
            + "; ".join(f"{e} shards only {', '.join(sorted(traits_of(e).sharded_families or ()))}"
                        for e in sorted(card.engines & MULTI_NODE_ENGINES))
            + " (a GGUF of any architecture llama.cpp loads pools across nodes)",
        )
    if min_nodes > 1 and not any(spans_with(e, sharding) for e in spanning):
        return ShardingUnsupported(
            card.model_id,
            sharding,
            f"min_nodes={min_nodes} but its multi-node engines {spanning} span nodes only with "
            f"{sorted({m for e in spanning for m in traits_of(e).span_shardings})} sharding "
            "(a llama.cpp pool splits layers: use Pipeline)",
        )
    if sharding == "Pipeline":
        reason = _invalid_world_size(card, sharding, min_nodes)
        if reason is not None:  # pipeline limits only tighten as the world grows
            return ShardingUnsupported(card.model_id, sharding, reason)
    return None


def _invalid_world_size(card: ModelCard, sharding: Sharding, size: int) -> str | None:
    if sharding == "Tensor":
        if card.num_attention_heads % size or card.num_key_value_heads % size:
            return (
                f"world size {size} does not divide num_attention_heads ({card.num_attention_heads}) "
                f"and num_key_value_heads ({card.num_key_value_heads})"
            )
        return None
    if size > card.num_layers:
        return f"{size} ranks exceed num_layers ({card.num_layers})"
    limit = card.placement.max_pipeline_split_layer
    if limit is not None and size - 1 > limit:
        return f"{size} ranks need {size - 1} stage boundaries, max_pipeline_split_layer is {limit}"
    return None


# ---------------------------------------------------------------------------------------
# Failure: the first rule that explains it
# ---------------------------------------------------------------------------------------


def _diagnose(s: _Search) -> PlacementError:
    error = (
        _no_members(s)
        or _all_excluded(s)
        or _no_readings(s)
        or _slots_unservable(s)
        or _no_compatible_backend(s)
        or _fits_only_if_connected(s)
        or _memory_short(s)
        or _no_valid_world_size(s)
    )
    return error if error is not None else _too_few_nodes(s)


def _no_members(s: _Search) -> PlacementError | None:
    return None if s.members else PlacementInfoPending("no cluster members known yet")


def _all_excluded(s: _Search) -> PlacementError | None:
    return None if s.eligible else ExclusionsRemovedAll(sorted(s.excluded), s.members)


def _no_readings(s: _Search) -> PlacementError | None:
    if s.compatible or s.incompatible or s.slot_refused:
        return None
    return PlacementInfoPending("node resources not gossiped yet", s.pending)


def _slots_unservable(s: _Search) -> PlacementError | None:
    """With requested slots: every node's reason when none can serve them (no engine with
    slots, a count beyond its engine's bound, or KV for that many that does not fit)."""
    if s.slots is None or s.pending or not (s.slot_refused or s.short_connected):
        return None
    reasons = [f"{node_id}: {reason}" for node_id, reason in sorted(s.slot_refused.items())]
    for option in s.short_connected:
        (shard,) = option.shards  # slotted placements are one node
        most = _most_slots_fitting(s.card, shard)
        bound = f"at most {most} fit" if most else "not even 1 fits"
        reasons.append(f"{shard.node.node_id}: KV for {s.slots} {backend_engine(shard.node.backend)} slots "
                       f"does not fit, {bound} ({_arithmetic(shard)})")
    return InvalidSlotSetting(s.card.model_id, s.slots, reasons)


def _no_compatible_backend(s: _Search) -> PlacementError | None:
    if s.compatible:
        return None
    if s.pending:
        return PlacementInfoPending("no reporting node is compatible; waiting for node resources", s.pending)
    usable = [tag for tag in s.card.placement.compatible_backends if tag in s.tags]  # in the card's order
    narrowed = len(usable) < len(s.card.placement.compatible_backends)
    return NoCompatibleBackend(s.card.model_id, usable, s.incompatible,
                               f"a {s.kv_type} KV cache, speculation {s.card.runtime.speculative or 'none'}"
                               if narrowed else None)


def _fits_only_if_connected(s: _Search) -> PlacementError | None:
    if not s.fit_but_disconnected:
        return None
    if s.pending or s.edge_lagging:
        return PlacementInfoPending("connection edges lagging node membership", sorted({*s.pending, *s.edge_lagging}))
    best = min(s.fit_but_disconnected, key=_Option.score)
    return TopologyGap(
        len(best.shards),
        [c.node_id for c in s.compatible],
        f"{list(best.node_ids)} would fit {s.card.model_id} but are not connected in a chain "
        f"(edges: {_edge_summary(s)})",
    )


def _memory_short(s: _Search) -> PlacementError | None:
    attempts = s.short_connected or s.short_disconnected
    if not attempts:
        return None
    if s.pending:
        return PlacementInfoPending("not every member's memory is known yet", s.pending)
    closest = min(attempts, key=_Option.worst_deficit)
    shortfalls = [
        NodeShortfall(
            node_id=shard.node.node_id,
            needed_bytes=shard.footprint.total_bytes,
            available_bytes=shard.node.available_bytes,
            arithmetic=_arithmetic(shard),
        )
        for shard in closest.shards
        if not shard.fits
    ]
    return MemoryShortfall(s.card.model_id, s.sharding, closest.node_ids, shortfalls)


def _no_valid_world_size(s: _Search) -> PlacementError | None:
    sizes = range(max(s.min_nodes, 1), len(s.compatible) + 1)
    if not sizes or any(size not in s.invalid_sizes for size in sizes):
        return None
    reasons = "; ".join(s.invalid_sizes[size] for size in sizes)
    return ShardingUnsupported(s.card.model_id, s.sharding, f"no usable world size among {list(sizes)}: {reasons}")


def _too_few_nodes(s: _Search) -> PlacementError:
    if s.pending:
        return PlacementInfoPending("waiting for node resources", s.pending)
    return TopologyGap(
        s.min_nodes,
        [c.node_id for c in s.compatible],
        f"needs {s.min_nodes} compatible node(s), only {len(s.compatible)} available",
    )


def _arithmetic(shard: _Shard) -> str:
    relation = ">" if shard.footprint.total_bytes > shard.node.available_bytes else ">="
    note = "" if relation == ">" else " (an exact fit thrashes)"
    if shard.slots_wanted is not None:
        note += (f" (even 1 of the node's {shard.slots_wanted} {backend_engine(shard.node.backend)} slots, "
                 f"{shard.footprint.context_tokens} tokens of context each, does not fit)")
    return f"{shard.footprint.describe()} {relation} {format_gb(shard.node.available_bytes)} available{note}"


def _edge_summary(s: _Search) -> str:
    return ", ".join(f"{a}-{b}" for a, b in s.links) or "none"


# ---------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------


def _assignments(option: _Option, runner_ids: Iterator[RunnerId]) -> list[ShardAssignment]:
    n = len(option.shards)
    return [
        ShardAssignment(
            node_id=shard.node.node_id,
            runner_id=next(runner_ids),
            rank=rank,
            world_size=n,
            start_layer=shard.start_layer,
            end_layer=shard.end_layer,
            backend=shard.node.backend,
            slots=shard.slots,
            slots_wanted=shard.slots_wanted,
            kv_cache_type=option.kv_type,
        )
        for rank, shard in enumerate(option.shards)
    ]


def _totals(resources: Mapping[NodeId, NodeResources], option: _Option) -> dict[NodeId, NodeMemoryTotals]:
    # A GPU-backed shard's node contributes its VRAM, so its window is sized from VRAM.
    return {
        s.node.node_id: NodeMemoryTotals(
            ram_total_bytes=resources[s.node.node_id].memory.ram_total_bytes,
            discrete_vram_bytes=discrete_vram_bytes(s.node.backend, resources[s.node.node_id]),
        )
        for s in option.shards
    }


def _capacity(
    card: ModelCard, resources: Mapping[NodeId, NodeResources], option: _Option, shards: Sequence[ShardAssignment]
) -> tuple[InstanceCapacity, int]:
    """The capacity planner on each hosting node's admission snapshot (available memory plus
    credit, the figure its shard was admitted against), and the window to stamp from it."""
    # A GPU backend's node with VRAM readings is a "vram" device (layers that do not fit
    # are shed to RAM); every other node is planned as RAM (every layer resident).
    devices = {
        s.node.node_id: shard_device(s.node.backend, resources[s.node.node_id], s.node.available_bytes)
        for s in option.shards
    }
    capacity = plan_instance(card, shards, devices)
    return capacity, stamped_context_tokens(card, shards, _totals(resources, option), capacity)


def _instantiate(
    card: ModelCard,
    resources: Mapping[NodeId, NodeResources],
    request: PlacementRequest,
    option: _Option,
    new_id: Callable[[], str],
) -> Instance:
    instance_id = InstanceId(new_id())  # instance first, then runners in rank order
    shards = _assignments(option, (RunnerId(new_id()) for _ in itertools.count()))
    capacity, context_token_limit = _capacity(card, resources, option, shards)
    return Instance(
        instance_id=instance_id,
        model_id=card.model_id,
        sharding=option.sharding,
        shards=shards,
        excluded_nodes=sorted(request.excluded_nodes),
        context_token_limit=context_token_limit,
        capacity=capacity,
        requested_slots=request.slots,
    )


def _to_preview(card: ModelCard, resources: Mapping[NodeId, NodeResources], option: _Option) -> PlacementPreview:
    shards = _assignments(option, (RunnerId(f"preview-{i}") for i in itertools.count()))
    capacity, context_token_limit = _capacity(card, resources, option, shards)
    return PlacementPreview(
        model_id=card.model_id,
        sharding=option.sharding,
        node_ids=list(option.node_ids),
        shards=[
            PreviewShard(
                node_id=shard.node.node_id,
                rank=rank,
                start_layer=shard.start_layer,
                end_layer=shard.end_layer,
                backend=shard.node.backend,
                needed_bytes=shard.footprint.total_bytes,
                available_bytes=shard.node.available_bytes,
                slots=shard.slots,
                slots_wanted=shard.slots_wanted,
                projector_bytes=shard.footprint.projector_bytes,
                breakdown=shard.footprint.describe(),
            )
            for rank, shard in enumerate(option.shards)
        ],
        context_token_limit=context_token_limit,
        capacity=capacity,
        kv_cache_type=option.kv_type,
    )


__all__ = [
    "MAX_PATH_STEPS",
    "MAX_SETS_PER_SIZE",
    "MULTI_NODE_ENGINES",
    "ExclusionsRemovedAll",
    "FamilyUnsupported",
    "InvalidSlotSetting",
    "MemoryShortfall",
    "ModelUnknown",
    "NoCompatibleBackend",
    "NodeShortfall",
    "PlacementError",
    "PlacementInfoPending",
    "PlacementPreview",
    "PlacementRequest",
    "PreviewShard",
    "ShardingUnsupported",
    "TopologyGap",
    "allocate_layers",
    "place",
    "preview",
]
