"""Memory arithmetic shared by placement (master), the worker's pre-load guard and the API.

Two questions, answered from a card's shape alone:

- *Does a shard fit?* `shard_footprint(card, share, context_tokens)`: the shard's share of
  the weights times ENGINE_OVERHEAD_FACTOR, plus a KV cache reservation for its layers at
  the admission context (`admission_context_tokens`), plus FLAT_FLOOR_BYTES. Placement
  compares that with a node's available memory; the footprint carries its own arithmetic
  for error messages. For a placed shard use `assignment_footprint(card, shard)`: the
  master admitted exactly that figure, so a worker guard re-checking it agrees.
- *What window does an instance serve?* `instance_context_token_limit(...)`: computed once
  at placement and stamped on the Instance, so every rank admits a request identically.
  It reads only static totals (total RAM, a discrete VRAM total), never the time-varying
  available-memory reading; the same inputs always give the same window.

KV arithmetic follows the card's attention layout (`ModelCard.is_windowed_layer`): a global
layer holds K and V for every token of the context, a windowed layer for at most
`sliding_window` tokens. Weights are shared out by layer count (storage_size_bytes x
layers / num_layers), which lumps embeddings and heads in with the blocks: the overhead
factor and the floor absorb that imprecision.

A vision card's multimodal projector (`projector_bytes`: its mmproj GGUF, which llama.cpp
loads whole beside the model) is not a share of the layers: it is added once, on the rank
that loads it, rank 0 (the single node, a pipeline's first stage, a pool's driver).

Pure and integer-exact (fractions, no floats in the sums), so master and worker agree to the
byte. Never reads telemetry, the clock or the disk.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from skulk.shared.kv_shape import value_dim
from skulk.shared.slots import kv_copies as slot_kv_copies
from skulk.shared.types.cards import ModelCard, backend_engine, has_gguf_projector
from skulk.shared.types.engines import VLLM_CONTEXT_CAP_TOKENS, WINDOW_AT_LOAD_ENGINES, context_cap
from skulk.shared.types.ids import NodeId
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.kv_cache import DEFAULT_KV_CACHE_TYPE, kv_bytes_per_element_group

ENGINE_OVERHEAD_FACTOR = 1.15
"""Runtime memory over the raw weight bytes: activations, engine scratch and allocator
slack, dequantisation buffers. Applied to the weight share only; the KV cache is reserved
separately."""

FLAT_FLOOR_BYTES = 512 * 1024 * 1024
"""Per-shard fixed cost independent of model size: the runner process, the Python
interpreter with mlx/llama.cpp loaded, and the engine's fixed buffers."""

ADMISSION_CONTEXT_FLOOR_TOKENS = 8192
"""KV cache placement reserves per shard, in tokens (or the card's whole context if
smaller). Also the smallest window an instance is ever stamped with."""

LOAD_TIME_WINDOW_ENGINES: frozenset[str] = WINDOW_AT_LOAD_ENGINES
"""Engines that commit their whole context window at load (from the engine traits table).
They get a window above the floor only where it lands in discrete GPU VRAM; MLX grows its KV
cache lazily per request."""


_OVERHEAD = Fraction(ENGINE_OVERHEAD_FACTOR).limit_denominator(1000)  # 23/20, exactly


@dataclass(frozen=True)
class NodeMemoryTotals:
    """A node's static memory totals: what the served window is sized against."""

    ram_total_bytes: int
    discrete_vram_bytes: int | None = None
    """Dedicated GPU VRAM; None for CPU, Apple unified memory, AMD APUs and unknown."""


@dataclass(frozen=True)
class Footprint:
    """One shard's admission footprint and the numbers it is made of."""

    weights_bytes: int
    kv_bytes: int
    context_tokens: int
    floor_bytes: int = FLAT_FLOOR_BYTES
    kv_copies: int = 1
    """Full contexts of KV reserved: a served engine's slots when each owns its own cache."""
    kv_type: str = DEFAULT_KV_CACHE_TYPE
    """The KV cache's element type (`skulk.shared.types.kv_cache`)."""
    overhead_factor: float = ENGINE_OVERHEAD_FACTOR
    draft_bytes: int = 0
    """A speculative draft model's weights and KV cache (`draft_ratio`), 0 without one."""
    projector_bytes: int = 0
    """A vision card's multimodal projector (`projector_bytes`) on the rank that loads it, else 0."""

    @property
    def weights_with_overhead_bytes(self) -> int:
        return _ceil(self.weights_bytes * Fraction(self.overhead_factor).limit_denominator(1000))

    @property
    def total_bytes(self) -> int:
        return (self.weights_with_overhead_bytes + self.kv_bytes + self.floor_bytes + self.draft_bytes
                + self.projector_bytes)

    def describe(self) -> str:
        """'weights 1.20 GB x 1.15 + KV 0.30 GB (8192 tokens) + floor 0.54 GB = 2.22 GB'."""
        return (
            f"weights {format_gb(self.weights_bytes)} x {self.overhead_factor:.2f} "
            f"+ KV {format_gb(self.kv_bytes)} ({self._kv_shape()}) "
            + (f"+ draft {format_gb(self.draft_bytes)} " if self.draft_bytes else "")
            + (f"+ projector {format_gb(self.projector_bytes)} " if self.projector_bytes else "")
            + f"+ floor {format_gb(self.floor_bytes)} = {format_gb(self.total_bytes)}"
        )


    def _kv_shape(self) -> str:
        kind = "" if self.kv_type == DEFAULT_KV_CACHE_TYPE else f" {self.kv_type}"
        if self.kv_copies == 1:
            return f"{self.context_tokens} tokens{kind}"
        return f"{self.context_tokens} tokens{kind} x {self.kv_copies} slots"


def format_gb(size_bytes: int) -> str:
    """Decimal gigabytes with two places, as every memory message prints them."""
    return f"{size_bytes / 1e9:.2f} GB"


def admission_context_tokens(card: ModelCard) -> int:
    """Tokens of KV cache placement reserves: the floor, or the card's context if smaller."""
    return min(ADMISSION_CONTEXT_FLOOR_TOKENS, card.context_length)


# -- KV cache ---------------------------------------------------------------------------------


def kv_bytes_per_token_per_layer(card: ModelCard, kv_type: str = DEFAULT_KV_CACHE_TYPE) -> int:
    """K and V for one token in one layer: kv_heads x (key + value head dims) elements of the
    cache's type (the value's dimension differs from the key's in some models, DeepSeek's
    among them)."""
    values = value_dim(card.head_dim, card.value_head_dim)
    elements = card.num_key_value_heads * (card.head_dim + values)
    return kv_bytes_per_element_group(elements, kv_type, (card.head_dim, values))


def kv_bytes_per_token(card: ModelCard, kv_type: str = DEFAULT_KV_CACHE_TYPE, layers: range | None = None) -> int:
    """KV growth per token over `layers` (all by default) while the context is within the
    sliding window: 2 x layers x kv_heads x head_dim x dtype. Past the window only global
    layers keep growing; `kv_cache_bytes` applies that cap."""
    span = range(card.num_layers) if layers is None else layers
    return len(span) * kv_bytes_per_token_per_layer(card, kv_type)


def kv_cache_bytes(
    card: ModelCard, context_tokens: int, layers: range | None = None, kv_type: str = DEFAULT_KV_CACHE_TYPE
) -> int:
    """KV cache for `layers` at `context_tokens`, windowed layers capped by the window."""
    global_rate, windowed_rate = _kv_rates(card, range(card.num_layers) if layers is None else layers, kv_type)
    window = card.sliding_window or 0
    return global_rate * context_tokens + windowed_rate * min(context_tokens, window)


def _kv_rates(card: ModelCard, layers: range, kv_type: str = DEFAULT_KV_CACHE_TYPE) -> tuple[int, int]:
    """(bytes/token over global layers, bytes/token over windowed layers) within `layers`."""
    per_layer = kv_bytes_per_token_per_layer(card, kv_type)
    windowed = sum(1 for i in layers if card.is_windowed_layer(i))
    return (len(layers) - windowed) * per_layer, windowed * per_layer


# -- shard footprints -----------------------------------------------------------------------


ShardShare = int | range | Fraction
"""Which part of the model a shard holds: a `range` of layers (a pipeline stage, exact), an
`int` count of layers (a stage whose position is unknown: its KV is bounded from above by
counting global layers first), or a `Fraction` of every layer (a tensor rank, 1/world)."""


def shard_footprint(
    card: ModelCard, share: ShardShare, context_tokens: int | None = None, kv_copies: int = 1,
    kv_type: str = DEFAULT_KV_CACHE_TYPE, loads_projector: bool | None = None,
) -> Footprint:
    """Admission footprint of one shard: its weight share x ENGINE_OVERHEAD_FACTOR + its KV
    cache of `kv_type` at `context_tokens` (default: the admission context) times
    `kv_copies` (a served engine's slots, each with its own cache:
    `skulk.shared.slots.kv_copies`) + FLAT_FLOOR_BYTES, + a draft model's share (`draft_ratio`),
    + the card's projector (`projector_bytes`) when the shard loads it. `loads_projector`
    None: a layer range that starts at layer 0 does; a layer count or a tensor fraction, whose
    rank is not known, is bounded from above (it does)."""
    if kv_copies < 1:
        raise ValueError(f"kv_copies {kv_copies} < 1")
    tokens = admission_context_tokens(card) if context_tokens is None else context_tokens
    if isinstance(share, range):
        if not 0 <= share.start < share.stop <= card.num_layers or share.step != 1:
            raise ValueError(f"layers {share} outside [0, {card.num_layers})")
        weights = Fraction(len(share), card.num_layers)
        kv = kv_cache_bytes(card, tokens, share, kv_type)
    elif isinstance(share, int):
        if not 0 < share <= card.num_layers:
            raise ValueError(f"layer count {share} outside [1, {card.num_layers}]")
        weights = Fraction(share, card.num_layers)
        kv = _kv_upper_bound(card, share, tokens, kv_type)
    elif isinstance(share, Fraction):  # pyright: ignore[reportUnnecessaryIsInstance] -- untyped callers
        if not 0 < share <= 1:
            raise ValueError(f"weight fraction {share} outside (0, 1]")
        weights = share
        kv = _ceil(kv_cache_bytes(card, tokens, kv_type=kv_type) * share)
    else:
        raise TypeError(f"share must be a layer range, a layer count or a Fraction, not {type(share).__name__}")
    target = Footprint(weights_bytes=_ceil(card.storage_size_bytes * weights), kv_bytes=kv * kv_copies,
                       context_tokens=tokens, kv_copies=kv_copies, kv_type=kv_type)
    if loads_projector is None:
        loads_projector = share.start == 0 if isinstance(share, range) else True
    return replace(target, draft_bytes=_ceil((target.weights_with_overhead_bytes + target.kv_bytes) * draft_ratio(card)),
                   projector_bytes=projector_bytes(card) if loads_projector else 0)


def projector_bytes(card: ModelCard) -> int:
    """Bytes of the multimodal projector a runner of `card` loads beside the model (its
    `vision_weights_size_bytes`), 0 for a card without one. A card logged before the size
    was stated counts 0, as before."""
    if not has_gguf_projector(card):
        return 0
    return card.vision_weights_size_bytes or 0


def draft_ratio(card: ModelCard) -> Fraction:
    """What a speculative draft model adds, as a fraction of the target's weights and KV
    cache: its size over the target's for a card that drafts with one (`runtime.speculative
    = "draft"`), else 0. The draft's KV cache is taken to scale with its size (layers x KV
    width grow together across a family), and it holds the target's context in the target's
    element type, as llama-server runs it (`ServerLaunch`)."""
    if card.runtime.speculative != "draft" or card.served_spec_draft_size_bytes is None:
        return Fraction(0)
    return Fraction(card.served_spec_draft_size_bytes, card.storage_size_bytes)


def shard_footprint_bytes(
    card: ModelCard, share: ShardShare, context_tokens: int | None = None, kv_copies: int = 1,
    kv_type: str = DEFAULT_KV_CACHE_TYPE, loads_projector: bool | None = None,
) -> int:
    """`shard_footprint(...).total_bytes`."""
    return shard_footprint(card, share, context_tokens, kv_copies, kv_type, loads_projector).total_bytes


def _kv_upper_bound(card: ModelCard, layer_count: int, tokens: int, kv_type: str = DEFAULT_KV_CACHE_TYPE) -> int:
    global_layers = sum(1 for i in range(card.num_layers) if not card.is_windowed_layer(i))
    per_layer = kv_bytes_per_token_per_layer(card, kv_type)
    as_global = min(layer_count, global_layers)
    window = min(tokens, card.sliding_window or tokens)
    return per_layer * (as_global * tokens + (layer_count - as_global) * window)


def assignment_share(card: ModelCard, shard: ShardAssignment) -> tuple[range, Fraction]:
    """(layers whose KV the shard holds, fraction of those layers' bytes it holds). A rank
    that spans the whole model in a world larger than one is a tensor rank (1/world_size of
    every layer); any other rank is a pipeline stage holding its range outright."""
    layers = range(shard.start_layer, shard.end_layer)
    if shard.world_size > 1 and shard.start_layer == 0 and shard.end_layer == card.num_layers:
        return layers, Fraction(1, shard.world_size)
    return layers, Fraction(1)


def assignment_footprint(card: ModelCard, shard: ShardAssignment, context_tokens: int | None = None) -> Footprint:
    """Admission footprint of a placed shard (at the admission context by default), with KV
    for every slot stamped on it and, on rank 0, the card's projector."""
    tokens = admission_context_tokens(card) if context_tokens is None else context_tokens
    layers, fraction = assignment_share(card, shard)
    return shard_footprint(card, layers if fraction == 1 else fraction, tokens, slot_kv_copies(shard.backend, shard.slots),
                           shard.kv_cache_type, loads_projector=shard.rank == 0)


def instance_node_footprints(card: ModelCard, instance: Instance) -> dict[NodeId, int]:
    """Admission bytes per hosting node (summed when a node hosts several ranks): what the
    master credits back for a just-deleted instance, and what a worker guard re-checks."""
    totals: dict[NodeId, int] = {}
    for shard in instance.shards:
        totals[shard.node_id] = totals.get(shard.node_id, 0) + assignment_footprint(card, shard).total_bytes
    return totals


# -- the served window --------------------------------------------------------------------


def instance_context_token_limit(
    card: ModelCard, shards: Sequence[ShardAssignment], node_totals: Mapping[NodeId, NodeMemoryTotals]
) -> int:
    """The window an instance serves, deterministic from static totals.

    For each hosting node: the pool is total RAM, or for an engine that commits its window
    at load (LOAD_TIME_WINDOW_ENGINES) the node's discrete VRAM; the node's tokens are the
    most whose KV cache (for its layers, windowed layers capped) fits the pool after its
    weight share x ENGINE_OVERHEAD_FACTOR and FLAT_FLOOR_BYTES. The limit is the minimum
    over nodes, capped at card.context_length (and the engine's `context_cap_tokens` trait: VLLM_CONTEXT_CAP_TOKENS for vLLM), and
    never below the admission floor. It clamps to the floor when the fit is uncomputable
    (a node without totals) or when a load-time-window engine has no discrete VRAM (CPU,
    Apple unified memory, AMD APUs: their load-time window competes with live memory).
    """
    floor = admission_context_tokens(card)
    ceiling = card.context_length
    for shard in shards:
        cap = context_cap(backend_engine(shard.backend))
        if cap is not None:
            ceiling = min(ceiling, cap)
    limit = ceiling
    for node_id, node_shards in _by_node(shards).items():
        totals = node_totals.get(node_id)
        if totals is None:
            return floor
        pool = _window_pool(node_shards, totals)
        if pool is None:
            return floor
        limit = min(limit, _tokens_fitting(card, node_shards, pool))
    return max(floor, min(limit, ceiling))


def _by_node(shards: Iterable[ShardAssignment]) -> dict[NodeId, list[ShardAssignment]]:
    grouped: dict[NodeId, list[ShardAssignment]] = {}
    for shard in shards:
        grouped.setdefault(shard.node_id, []).append(shard)
    return grouped


def _window_pool(shards: Sequence[ShardAssignment], totals: NodeMemoryTotals) -> int | None:
    """Bytes the node's window is sized against, or None when it must keep the floor."""
    if not any(backend_engine(s.backend) in LOAD_TIME_WINDOW_ENGINES for s in shards):
        return totals.ram_total_bytes
    on_gpu = all(s.backend.partition("-")[2] in ("cuda", "rocm", "vulkan") for s in shards)
    if totals.discrete_vram_bytes is None or not on_gpu:
        return None
    return totals.discrete_vram_bytes


def _tokens_fitting(card: ModelCard, shards: Sequence[ShardAssignment], pool_bytes: int) -> int:
    """Most tokens whose KV for these shards fits `pool_bytes` after their fixed costs
    (card.context_length when the KV stops growing before the budget runs out)."""
    fixed_bytes, global_rate, windowed_rate = _node_costs(card, shards)
    budget = pool_bytes - fixed_bytes
    if budget <= 0:
        return 0
    rate = global_rate + windowed_rate
    if rate == 0:
        return card.context_length
    within_window = math.floor(budget / rate)
    window = card.sliding_window
    if window is None or windowed_rate == 0 or within_window <= window:
        return within_window
    if global_rate == 0:  # every layer windowed: the cache stops growing at the window
        return card.context_length
    return math.floor((budget - windowed_rate * window) / global_rate)


def _node_costs(card: ModelCard, shards: Sequence[ShardAssignment]) -> tuple[int, Fraction, Fraction]:
    """(fixed bytes: weights x overhead + floor (+ draft, + projector) per shard, KV bytes/token over global layers,
    KV bytes/token over windowed layers) for the shards one node hosts."""
    fixed = 0
    global_rate = windowed_rate = Fraction(0)
    for shard in shards:
        layers, fraction = assignment_share(card, shard)
        footprint = assignment_footprint(card, shard, context_tokens=0)
        fixed += (footprint.weights_with_overhead_bytes + footprint.floor_bytes + footprint.draft_bytes
                  + footprint.projector_bytes)
        g, w = _kv_rates(card, layers, shard.kv_cache_type)
        copies = slot_kv_copies(shard.backend, shard.slots)  # every slot's cache grows per token
        with_draft = 1 + draft_ratio(card)  # a draft's cache grows with the target's
        global_rate += g * fraction * copies * with_draft
        windowed_rate += w * fraction * copies * with_draft
    return fixed, global_rate, windowed_rate


def _ceil(value: Fraction | int) -> int:
    return math.ceil(value)


__all__ = [
    "ADMISSION_CONTEXT_FLOOR_TOKENS",
    "ENGINE_OVERHEAD_FACTOR",
    "FLAT_FLOOR_BYTES",
    "LOAD_TIME_WINDOW_ENGINES",
    "VLLM_CONTEXT_CAP_TOKENS",
    "Footprint",
    "NodeMemoryTotals",
    "ShardShare",
    "admission_context_tokens",
    "assignment_footprint",
    "assignment_share",
    "draft_ratio",
    "format_gb",
    "instance_context_token_limit",
    "instance_node_footprints",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_layer",
    "kv_cache_bytes",
    "projector_bytes",
    "shard_footprint",
    "shard_footprint_bytes",
]
