"""The capacity planner: what context a model can serve on one device, right now.

Given a model's shape (`ModelMeta`), a live free-memory snapshot of the target device
(`DeviceSnapshot`) and a policy (`CapacityPolicy`), `plan_capacity` computes:

- effective_context_tokens: the dense context the model can serve now (capped at the
  trained context);
- hot_kv_tokens: tokens of KV the device's hot budget physically holds;
- planner_effective_context_tokens: the logical window including the host-RAM cold store;
- gpu_layers: layers resident on the device. On a VRAM device (the llama path) layers are
  shed from the front, as llama.cpp offloads the *last* n_gpu_layers, until the minimum hot
  context fits; a RAM device holds every layer.

When even the minimum hot context does not fit, the result is a `CapacityShortfall` naming
why, the bytes needed and the bytes available. A shard of a placed instance is planned the
same way over the layers it holds and its share of them (`plan_capacity(..., layers=,
share=)`); `skulk.capacity.instance` does that for every rank at placement.

KV arithmetic follows the card's attention layout exactly (`ModelCard.is_windowed_layer`):
a global layer holds K and V for every token, a windowed layer for at most `sliding_window`
tokens. So for models with windowed layers the context is limited by the global layers
only. This mirrors `skulk.shared.memory_estimate` (which works on whole cards and shard
assignments, for placement); here the shape may come from a card, a config.json or a GGUF
header, so the few lines of arithmetic are stated over `ModelMeta`. A test pins the two to
the same bytes for a card.

Pure except `model_meta_from_gguf`, which reads one file's header. Never reads telemetry,
the clock or the environment; the caller takes the memory snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from skulk.shared.kv_shape import config_kv_shape, gguf_value_head_dim, value_dim
from skulk.shared.types.cards import ModelCard, windowed_layer
from skulk.shared.types.kv_cache import DEFAULT_KV_CACHE_TYPE, kv_bytes_per_element_group

DEFAULT_RESERVE_BYTES = 1024**3
"""Memory left to the OS, the driver and other processes: 1 GiB."""

DEFAULT_HEADROOM_FRACTION = 0.05
"""Share of the device's total memory kept free for allocator slack and fragmentation."""

DEFAULT_MIN_HOT_CONTEXT_TOKENS = 4096
"""Smallest hot context worth serving: below it a chat with a system prompt and tools
does not fit, so the planner sheds GPU layers (or refuses) rather than serve less."""

GGUF_DEFAULT_WINDOW_PATTERN: Mapping[str, int] = {"gemma2": 2, "gemma3": 6}
"""Interleave period for architectures whose GGUF header states a sliding window but no
pattern: llama.cpp hard-codes these (Gemma 2 alternates, Gemma 3 has one global layer in six)."""


class ModelShapeError(ValueError):
    """The metadata does not describe a shape the planner can cost (a missing key, or a
    window interleave that is not periodic in the card's sense)."""


@dataclass(frozen=True)
class ModelMeta:
    """A model's shape, as the planner needs it. Window semantics are the card's:

    - sliding_window None (then sliding_window_pattern is None): every layer is global;
    - sliding_window W, pattern None: every layer is windowed to W;
    - sliding_window W, pattern N: layer i is global iff (i + 1) % N == 0.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    weights_bytes: int
    trained_context_tokens: int
    sliding_window: int | None = None
    sliding_window_pattern: int | None = None
    value_head_dim: int | None = None
    """The values' per-head dimension where it differs from the keys' (None: head_dim; 0:
    keys only, llama.cpp's MLA latent)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "trained_context_tokens"):
            if getattr(self, name) <= 0:
                raise ModelShapeError(f"{name} must be positive, got {getattr(self, name)}")
        if self.value_head_dim is not None and self.value_head_dim < 0:
            raise ModelShapeError(f"value_head_dim must not be negative, got {self.value_head_dim}")
        if self.weights_bytes < 0:
            raise ModelShapeError(f"weights_bytes must not be negative, got {self.weights_bytes}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ModelShapeError(f"sliding_window must be positive, got {self.sliding_window}")
        if self.sliding_window_pattern is not None:
            if self.sliding_window is None:
                raise ModelShapeError("sliding_window_pattern needs a sliding_window")
            if self.sliding_window_pattern < 2:
                raise ModelShapeError(f"sliding_window_pattern must be >= 2, got {self.sliding_window_pattern}")

    def is_windowed_layer(self, layer_index: int) -> bool:
        """Whether layer `layer_index` (0-based) uses the sliding window (card rule)."""
        return windowed_layer(layer_index, self.num_layers, self.sliding_window, self.sliding_window_pattern)


# -- reading shapes ---------------------------------------------------------------------------


def model_meta_from_card(card: ModelCard) -> ModelMeta:
    """The card's shape; weights are its storage_size_bytes."""
    return ModelMeta(
        num_layers=card.num_layers,
        num_kv_heads=card.num_key_value_heads,
        head_dim=card.head_dim,
        weights_bytes=card.storage_size_bytes,
        trained_context_tokens=card.context_length,
        sliding_window=card.sliding_window,
        sliding_window_pattern=card.sliding_window_pattern,
        value_head_dim=card.value_head_dim,
    )


def pattern_from_layer_flags(windowed: Sequence[bool]) -> int | None:
    """Per-layer windowed flags -> the card's pattern N (None = every layer windowed).

    Raises ModelShapeError when no N reproduces the flags (global iff (i + 1) % N == 0),
    or when no layer is windowed (the caller should then drop the window instead)."""
    count = len(windowed)
    if count == 0 or not any(windowed):
        raise ModelShapeError("no windowed layer: the model has no sliding window")
    if all(windowed):
        return None
    first_global = windowed.index(False)
    period = first_global + 1
    expected = [(i + 1) % period != 0 for i in range(count)]
    if period < 2 or expected != list(windowed):
        raise ModelShapeError(f"window layout {['W' if w else 'G' for w in windowed]} is not periodic with the last layer of each period global")
    return period


def model_meta_from_config(config_json: Mapping[str, Any], weights_bytes: int) -> ModelMeta:
    """A Hugging Face config.json's shape. Multimodal configs (Gemma 3) nest the language
    model under `text_config`; its keys win. Interleaving comes from `layer_types`
    ('sliding_attention' / 'full_attention' per layer) or `sliding_window_pattern`;
    `use_sliding_window: false` (Qwen 2) means no window at all."""
    config: dict[str, Any] = dict(config_json)
    text = config_json.get("text_config")
    if isinstance(text, Mapping):
        config.update(text)
    try:
        num_layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv = config_kv_shape(config, heads, int(config["hidden_size"]))
        context = int(config["max_position_embeddings"])
    except KeyError as exc:
        raise ModelShapeError(f"config.json lacks {exc.args[0]!r}") from None

    window = config.get("sliding_window")
    pattern: int | None = None
    if config.get("use_sliding_window") is False or not window:
        window = None
    elif isinstance(config.get("layer_types"), list):
        flags = [kind == "sliding_attention" for kind in config["layer_types"]]
        if len(flags) != num_layers:
            raise ModelShapeError(f"layer_types has {len(flags)} entries for {num_layers} layers")
        pattern = pattern_from_layer_flags(flags) if any(flags) else None
        window = window if any(flags) else None
    elif config.get("sliding_window_pattern"):
        pattern = int(config["sliding_window_pattern"])
    return ModelMeta(
        num_layers=num_layers,
        num_kv_heads=kv.kv_heads,
        head_dim=kv.head_dim,
        weights_bytes=weights_bytes,
        trained_context_tokens=context,
        sliding_window=int(window) if window else None,
        sliding_window_pattern=pattern,
        value_head_dim=kv.value_head_dim,
    )


def model_meta_from_gguf(path: Path) -> ModelMeta:
    """A GGUF file's shape from its header (`<arch>.block_count`, `.attention.head_count_kv`,
    `.attention.key_length` or embedding_length / head_count, `.context_length`,
    `.attention.sliding_window`); weights are the file's size. Tensor data is not read."""
    from gguf import GGUFReader  # lazy: the planner itself needs no numpy

    reader = GGUFReader(str(path), "r")

    def value(key: str) -> Any:
        field = reader.fields.get(key)
        return None if field is None else field.contents()

    arch = value("general.architecture")
    if not isinstance(arch, str):
        raise ModelShapeError(f"{path}: GGUF header lacks general.architecture")

    def required(key: str) -> int:
        found = value(f"{arch}.{key}")
        if found is None:
            raise ModelShapeError(f"{path}: GGUF header lacks {arch}.{key}")
        return int(found)

    num_layers = required("block_count")
    heads = required("attention.head_count")
    kv_heads = value(f"{arch}.attention.head_count_kv")
    key_length = value(f"{arch}.attention.key_length")
    head_dim = int(key_length) if key_length is not None else required("embedding_length") // heads
    window = value(f"{arch}.attention.sliding_window")
    pattern: int | None = None
    raw_pattern = value(f"{arch}.attention.sliding_window_pattern")
    if window:
        if isinstance(raw_pattern, list):
            pattern = pattern_from_layer_flags([bool(x) for x in raw_pattern])
        elif raw_pattern:
            pattern = int(raw_pattern)
        else:
            pattern = GGUF_DEFAULT_WINDOW_PATTERN.get(arch)
    return ModelMeta(
        num_layers=num_layers,
        num_kv_heads=int(kv_heads) if kv_heads is not None else heads,
        head_dim=head_dim,
        weights_bytes=Path(path).stat().st_size,
        trained_context_tokens=required("context_length"),
        sliding_window=int(window) if window else None,
        sliding_window_pattern=pattern,
        value_head_dim=gguf_value_head_dim(
            {key: value(f"{arch}.{key}") for key in ("attention.key_length_mla", "attention.value_length")}, head_dim),
    )


# -- KV arithmetic ----------------------------------------------------------------------------


def kv_bytes_per_token_per_layer(meta: ModelMeta, kv_type: str = DEFAULT_KV_CACHE_TYPE) -> int:
    """K and V for one token in one layer: kv_heads x (key + value head dims) elements of
    the cache's type (`skulk.shared.types.kv_cache`)."""
    values = value_dim(meta.head_dim, meta.value_head_dim)
    return kv_bytes_per_element_group(meta.num_kv_heads * (meta.head_dim + values), kv_type, (meta.head_dim, values))


def kv_rates(meta: ModelMeta, layers: range | None = None, kv_type: str = DEFAULT_KV_CACHE_TYPE) -> tuple[int, int]:
    """(bytes/token over the global layers, bytes/token over the windowed layers) in `layers`."""
    span = range(meta.num_layers) if layers is None else layers
    per_layer = kv_bytes_per_token_per_layer(meta, kv_type)
    windowed = sum(1 for i in span if meta.is_windowed_layer(i))
    return (len(span) - windowed) * per_layer, windowed * per_layer


def kv_cache_bytes(
    meta: ModelMeta, context_tokens: int, layers: range | None = None, kv_type: str = DEFAULT_KV_CACHE_TYPE
) -> int:
    """KV cache over `layers` (all by default) at `context_tokens`; windowed layers cost at
    most `sliding_window` tokens each."""
    global_rate, windowed_rate = kv_rates(meta, layers, kv_type)
    return global_rate * context_tokens + windowed_rate * min(context_tokens, meta.sliding_window or 0)


def tokens_fitting(meta: ModelMeta, budget_bytes: int, layers: range | None = None, kv_type: str = DEFAULT_KV_CACHE_TYPE) -> int:
    """Most tokens whose KV over `layers` fits `budget_bytes`. When the cache stops growing
    (every layer in `layers` windowed, and the window fits) the answer is the trained context."""
    if budget_bytes <= 0:
        return 0
    global_rate, windowed_rate = kv_rates(meta, layers, kv_type)
    rate = global_rate + windowed_rate
    if rate == 0:
        return meta.trained_context_tokens
    within_window = budget_bytes // rate
    window = meta.sliding_window
    if window is None or windowed_rate == 0 or within_window < window:
        return within_window
    if global_rate == 0:
        return meta.trained_context_tokens
    return (budget_bytes - windowed_rate * window) // global_rate


# -- the plan ---------------------------------------------------------------------------------

DeviceKind = Literal["ram", "vram"]


@dataclass(frozen=True)
class DeviceSnapshot:
    """A live reading of the target device: system RAM or accelerator VRAM."""

    kind: DeviceKind
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class CapacityPolicy:
    reserve_bytes: int = DEFAULT_RESERVE_BYTES
    """Bytes of free memory never planned into (OS, driver, other processes)."""
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION
    """Share of total_bytes additionally kept free."""
    min_hot_context_tokens: int = DEFAULT_MIN_HOT_CONTEXT_TOKENS
    """Floor on the hot context (or the trained context, if smaller)."""
    kv_cache_type: str = DEFAULT_KV_CACHE_TYPE
    """The KV cache element type (`skulk.shared.types.kv_cache`): a quantized cache holds
    more tokens in the same bytes."""
    cold_budget_bytes: int = 0
    """Host-RAM bytes for cold KV blocks, extending the logical window past the hot one."""


@dataclass(frozen=True)
class CapacityPlan:
    device_kind: DeviceKind
    usable_bytes: int
    """free - reserve - headroom: what the plan spends."""
    gpu_layers: int
    """Layers resident on the device (all of them on a RAM device)."""
    weights_resident_bytes: int
    kv_budget_bytes: int
    kv_bytes_per_token: int
    """Dense KV growth per token over every layer (before any window caps it)."""
    hot_kv_tokens: int
    effective_context_tokens: int
    planner_effective_context_tokens: int


ShortfallReason = Literal["weights_exceed_memory", "min_hot_context_unfit"]


@dataclass(frozen=True)
class CapacityShortfall:
    """Even the minimum hot context does not fit on this device."""

    reason: ShortfallReason
    needed_bytes: int
    available_bytes: int
    min_hot_context_tokens: int

    def describe(self) -> str:
        what = "the weights alone" if self.reason == "weights_exceed_memory" else (
            f"the minimum hot context ({self.min_hot_context_tokens} tokens)"
        )
        return f"{what} need {self.needed_bytes} bytes, only {self.available_bytes} usable"


def usable_bytes(device: DeviceSnapshot, policy: CapacityPolicy) -> int:
    """free - reserve - ceil(total x headroom), never below zero."""
    headroom = math.ceil(device.total_bytes * Fraction(policy.headroom_fraction).limit_denominator(10**6))
    return max(0, device.free_bytes - policy.reserve_bytes - headroom)


def plan_capacity(
    meta: ModelMeta,
    device: DeviceSnapshot,
    policy: CapacityPolicy,
    *,
    layers: range | None = None,
    share: Fraction = Fraction(1),
    kv_copies: int = 1,
    resident_bytes: int = 0,
) -> CapacityPlan | CapacityShortfall:
    """The capacity plan for `meta` on `device`, or why even the minimum does not fit.

    By default the whole model. A shard of a placed instance passes the `layers` it holds (a
    pipeline stage) and the `share` of those layers' weights and KV it holds (1/world for a
    tensor rank): the plan is then that shard's, on its own device, with `gpu_layers`
    counted within `layers`. `kv_copies` full caches are reserved per token (a served engine
    whose every slot owns its context): the token counts are then per slot. `resident_bytes`
    are held on the device beside the layers (a vision card's projector on rank 0) and come
    off the usable memory first."""
    span = range(meta.num_layers) if layers is None else layers
    if span.step != 1 or not 0 <= span.start < span.stop <= meta.num_layers:
        raise ModelShapeError(f"layers {span} outside [0, {meta.num_layers})")
    if not 0 < share <= 1:
        raise ModelShapeError(f"share {share} outside (0, 1]")
    if kv_copies < 1:
        raise ModelShapeError(f"kv_copies {kv_copies} < 1")
    if resident_bytes < 0:
        raise ModelShapeError(f"resident_bytes {resident_bytes} < 0")
    kv_share = share * kv_copies  # of one full-model cache, per token of one slot
    usable = max(0, usable_bytes(device, policy) - resident_bytes)
    min_hot = min(policy.min_hot_context_tokens, meta.trained_context_tokens)
    dense_rate = math.ceil(len(span) * kv_bytes_per_token_per_layer(meta, policy.kv_cache_type) * share)
    if device.kind == "ram":
        layers_on_device = len(span)
        weights_all = _layer_weights(meta, len(span), share)
        if weights_all >= usable:
            return CapacityShortfall("weights_exceed_memory", weights_all, usable, min_hot)
    else:
        layers_on_device = _gpu_layers_for_min_hot(
            meta, span, share, usable, min_hot, policy.kv_cache_type, kv_share
        )
        if layers_on_device == 0:
            needed = _layer_weights(meta, 1, share) + _kv(meta, min_hot, _last_of(span, 1), kv_share,
                                                           policy.kv_cache_type)
            return CapacityShortfall("min_hot_context_unfit", needed, usable, min_hot)
    resident = _last_of(span, layers_on_device)
    weights = _layer_weights(meta, layers_on_device, share)
    budget = usable - weights
    # A token costs `share` of the layers' full KV, so the budget holds 1/share as many.
    hot = tokens_fitting(meta, math.floor(budget / kv_share), resident, policy.kv_cache_type)
    if hot < min_hot:
        needed = weights + _kv(meta, min_hot, resident, kv_share, policy.kv_cache_type)
        return CapacityShortfall("min_hot_context_unfit", needed, usable, min_hot)
    effective = min(hot, meta.trained_context_tokens)
    # Cold blocks hold tokens older than the hot window; windowed layers never need those,
    # so a cold token costs only the global layers' KV.
    global_rate, _ = kv_rates(meta, span, policy.kv_cache_type)
    global_rate = math.ceil(global_rate * kv_share)
    cold_tokens = policy.cold_budget_bytes // global_rate if global_rate else 0
    return CapacityPlan(
        device_kind=device.kind,
        usable_bytes=usable,
        gpu_layers=layers_on_device,
        weights_resident_bytes=weights,
        kv_budget_bytes=budget,
        kv_bytes_per_token=dense_rate,
        hot_kv_tokens=hot,
        effective_context_tokens=effective,
        planner_effective_context_tokens=min(meta.trained_context_tokens, effective + cold_tokens),
    )


def _last_of(span: range, count: int) -> range:
    """llama.cpp offloads the last n_gpu_layers blocks (of the layers this shard holds)."""
    return range(span.stop - count, span.stop)


def _layer_weights(meta: ModelMeta, count: int, share: Fraction = Fraction(1)) -> int:
    """Weights shared out by layer count (embeddings and heads lumped in, as placement does)."""
    return math.ceil(Fraction(meta.weights_bytes * count, meta.num_layers) * share)


def _kv(meta: ModelMeta, tokens: int, layers: range, share: Fraction, kv_type: str) -> int:
    return math.ceil(kv_cache_bytes(meta, tokens, layers, kv_type) * share)


def _gpu_layers_for_min_hot(
    meta: ModelMeta, span: range, share: Fraction, usable: int, min_hot: int, kv_type: str,
    kv_share: Fraction | None = None,
) -> int:
    """Most layers (from the end of `span`) whose weights plus KV for `min_hot` tokens fit; 0 if none."""
    kv_share = share if kv_share is None else kv_share
    for count in range(len(span), 0, -1):
        if _layer_weights(meta, count, share) + _kv(meta, min_hot, _last_of(span, count), kv_share, kv_type) <= usable:
            return count
    return 0


__all__ = [
    "DEFAULT_HEADROOM_FRACTION",
    "DEFAULT_MIN_HOT_CONTEXT_TOKENS",
    "DEFAULT_RESERVE_BYTES",
    "GGUF_DEFAULT_WINDOW_PATTERN",
    "CapacityPlan",
    "CapacityPolicy",
    "CapacityShortfall",
    "DeviceSnapshot",
    "ModelMeta",
    "ModelShapeError",
    "kv_bytes_per_token_per_layer",
    "kv_cache_bytes",
    "kv_rates",
    "model_meta_from_card",
    "model_meta_from_config",
    "model_meta_from_gguf",
    "pattern_from_layer_flags",
    "plan_capacity",
    "tokens_fitting",
    "usable_bytes",
]
