"""What each runner engine can do: one table that cards, placement, the worker and the API
all read.

Before this table the same facts lived in several places (which engines read GGUF, which
span nodes, which commit their KV window at load, which request features they honour), and
they drifted: an MLX instance silently returned empty logprobs because nothing said MLX had
none. Now a fact about an engine is written once, here, and everything else derives from
it: `skulk.shared.types.cards` its engine vocabularies, `skulk.master.placement` which
engines and families span nodes, `skulk.shared.memory_estimate` which engines commit their
window at load, and the API (`skulk.api.generation.bind_instance`) which request features
the placed engine honours, refusing the others with a 400 that names feature and engine.

`required_features(params)` is the other half: the features a normalised request asks for,
each with the parameter that asked. Data and pure functions only; no engine library here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from skulk.shared.types.engine_architectures import (
    LLAMA_CPP_ARCHITECTURES,
    MLX_MODEL_REMAPPING,
    MLX_MODEL_TYPES,
)

if TYPE_CHECKING:
    from skulk.shared.types.tasks import TextGenerationParams

ArtifactFormat = Literal["safetensors", "gguf", "ctranslate2", "onnx", "mlx_whisper"]
"""How a model's files are laid out: a safetensors folder (MLX, vLLM), one GGUF file
(llama.cpp), a CTranslate2 model folder (faster-whisper), an ONNX model with its JSON
config (Piper voices) or an MLX Whisper folder (mlx-whisper: config.json holding Whisper's
`ModelDimensions` and weights.safetensors or weights.npz, with MLX's parameter names).

The MLX Whisper layout is its own format, not "safetensors": its config.json is no HF
config (no `model_type` mlx-lm loads, no tokenizer files), its weights are one file under a
fixed name, and a card listing it beside `mlx` would pass as a text model's artifact; as a
format of its own a card names exactly one engine family that can read it."""

SPEECH_FORMATS: tuple[ArtifactFormat, ...] = ("ctranslate2", "onnx", "mlx_whisper")
"""The speech engines' own layouts: a card whose engines share one of these describes that
layout (`ModelCard.artifact_format`), never a safetensors folder."""


class Feature(StrEnum):
    """A request feature an engine may or may not honour. The value reads as English, so
    an error can say "the mlx engine does not support structured output"."""

    LOGPROBS = "logprobs"
    STRUCTURED_OUTPUT = "structured output"
    FORCED_TOOL_CALLS = "forced tool calls"
    PENALTIES = "repetition penalties"
    LOGIT_BIAS = "logit bias"
    N = "several choices (n)"
    PROMPT_LOGPROBS = "prompt logprobs (echo with logprobs)"
    IMAGES = "image input"
    """A chat message's `images` (`skulk.shared.types.media`): the engine puts each image's
    embedding where its marker stands. llama-server and the in-process llama.cpp engine (one
    node, not a pool) with the card's projector, and MLX for a card that sees (its mlx-vlm
    path, `EngineTraits.vision_features`)."""


@dataclass(frozen=True)
class SlotTraits:
    """A served engine's slots: how many requests one server decodes at once.

    `setting_env`: the node setting an operator sets the count with. `default`: the count
    when unset. `maximum`: above it a setting is refused as a typo. `kv_per_slot`: every
    slot reserves a whole context of KV cache (llama-server with `--no-kv-unified`), where
    a paged engine (vLLM) shares one context's pool between its sequences."""

    setting_env: str
    default: int
    maximum: int
    kv_per_slot: bool = False


@dataclass(frozen=True)
class EngineTraits:
    """One engine's facts.

    `formats`: the artifact formats it loads. `multi_node`: whether one instance may span
    nodes on it. `sharded_families`: for a multi-node engine, the model families it has a
    sharding layout for (others are placed on one node only, never failed at load); None
    means every family it loads (llama.cpp's RPC pooling splits any GGUF by layers).
    `span_shardings`: the shardings a multi-node instance of it may use.
    `window_at_load`: it commits its whole KV window when it loads (so placement sizes the
    window to discrete VRAM), where the others grow their cache per request. `features`:
    the request features it honours; a request asking for another is refused.
    `pipeline_features`: the features it honours when one instance is a pipeline over
    several ranks (None: the same as `features`). `workloads`: the kinds of work it serves
    (`skulk.shared.types.workloads`: text, embeddings, echo, transcription, speech); a
    request for another is refused.
    `families`: the model families it can load at all (None: any its formats hold);
    placement never puts a model of another family on it (it would only fail at load).

    How it runs and where it can: `binary_env`: a served engine (the runner launches a
    server process) names its binary with this node setting (`managed_build`: `skulk engines
    install` can provide it, and says its compute); None: in-process, loaded by
    `modules` (the Python packages that must import). `apple_only`: it serves only on Apple
    Silicon. `vendor_computes`: the compute a visible GPU of each vendor gives it (Intel is
    never inferred: an integrated GPU is no serving accelerator). `cpu_floor`: it can serve
    on CPU when no GPU compute applies. `slots`: a served engine's concurrent requests
    (None: one at a time, in-process). `ranks_dial`: its ranks dial each other's hosts
    (MLX's ring, a llama.cpp pool's channel), so placement hands out ring hosts.
    `pool_donors`: ranks after 0 lend their memory to rank 0 (llama.cpp's RPC pool) rather
    than run the engine. `served_twin`: the served engine that reads the same artifacts,
    many requests at a time (placement tries it first unless the card ranks it).
    `context_cap_tokens`: the most context one instance of it serves, whatever the card
    says (None: the card's)."""

    formats: frozenset[ArtifactFormat]
    families: frozenset[str] | None = None
    multi_node: bool = False
    sharded_families: frozenset[str] | None = frozenset()
    span_shardings: frozenset[str] = frozenset({"Pipeline", "Tensor"})
    window_at_load: bool = False
    features: frozenset[Feature] = frozenset()
    pipeline_features: frozenset[Feature] | None = None
    vision_features: frozenset[Feature] | None = None
    """The features it honours on its vision path: a separate model path (MLX: mlx-vlm) for a
    card that sees (capability "vision") of one of `vision_families`; None: no such path. A
    model on the vision path runs on one node (`shards_model`)."""
    vision_families: frozenset[str] = frozenset()
    """The model families its vision path runs (`on_vision_path`)."""
    workloads: frozenset[str] = frozenset({"text"})
    binary_env: str | None = None
    managed_build: bool = False
    modules: tuple[str, ...] = ()
    apple_only: bool = False
    vendor_computes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cpu_floor: bool = True
    slots: SlotTraits | None = None
    ranks_dial: bool = False
    pool_donors: bool = False
    served_twin: str | None = None
    context_cap_tokens: int | None = None
    kv_cache_types: tuple[str, ...] = ("f16",)
    """The KV cache element types it serves (`skulk.shared.types.kv_cache`)."""
    speculative: tuple[str, ...] = ()
    """The speculative decoding methods it serves (`skulk.shared.types.speculative`)."""

    @property
    def served(self) -> bool:
        """Whether the runner serves through a separate server process."""
        return self.binary_env is not None


MLX_VLM_VISION_TYPES: frozenset[str] = frozenset({"llava", "gemma3", "qwen2_5_vl"})
"""config.json `model_type` values whose vision tower MLX's vision path runs through mlx-vlm
(`skulk.worker.engines.mlx.vision`, whose `VISION_FAMILIES` holds how each places its image
tokens), as tested on generated models (local/tiny-vlm: LLaVA; local/tiny-gemma3-vlm: Gemma 3,
which expands `<start_of_image>`; local/tiny-qwen2.5-vl: Qwen2.5-VL, which expands its
`<|image_pad|>` by the image's grid and numbers positions with M-RoPE). mlx-vlm (0.7) loads
many more families, but each processor places its image tokens its own way: a family joins
here once a test shows its prompt and embeddings line up. A card that sees with another family
runs on the text path, where images are refused by name. Ours, not generated from mlx-vlm
(`engine_architectures` is)."""

MLX_FAMILIES: frozenset[str] = MLX_MODEL_TYPES | frozenset(MLX_MODEL_REMAPPING) | MLX_VLM_VISION_TYPES
"""config.json `model_type` values MLX loads: mlx-lm's model modules and its own aliases, and
the vision-language families its vision path loads through mlx-vlm."""

_GGUF_COMPUTES: Mapping[str, str] = MappingProxyType({"nvidia": "cuda", "amd": "vulkan", "apple": "metal"})
"""AMD maps to Vulkan, the lane the managed builds and the AMD guide use; a ROCm/HIP build
is declared (SKULK_LLAMA_CPP_BACKENDS=rocm)."""

_APPLE_COMPUTES: Mapping[str, str] = MappingProxyType({"apple": "metal"})

VLLM_CONTEXT_CAP_TOKENS = 32768
"""vLLM commits and optimises its entire declared window at start, so a 262k card would take
over an hour to bring up; its placements are capped here until vLLM-aware admission lands."""

ENGINE_TRAITS: Mapping[str, EngineTraits] = MappingProxyType({
    "llama_cpp": EngineTraits(
        formats=frozenset({"gguf"}),
        families=LLAMA_CPP_ARCHITECTURES,
        # Pooled over llama.cpp's RPC backend (skulk.pool): rank 0 drives, the other ranks
        # lend their memory as ggml RPC servers; layers split in contiguous ranges.
        multi_node=True,
        sharded_families=None,
        span_shardings=frozenset({"Pipeline"}),
        window_at_load=True,
        # Images through the card's projector, driven with mtmd (engines.llama_cpp.vision).
        # A pool's driver has no mtmd path over its donors' layers: a pooled instance
        # refuses images.
        features=frozenset(Feature),
        pipeline_features=frozenset(Feature) - {Feature.IMAGES},
        workloads=frozenset({"text", "embeddings", "echo"}),
        modules=("llama_cpp",),
        vendor_computes=_GGUF_COMPUTES,
        ranks_dial=True,
        pool_donors=True,
        served_twin="llama_server",
        kv_cache_types=("f16", "q8_0", "q4_0"),
    ),
    "llama_server": EngineTraits(
        formats=frozenset({"gguf"}),
        families=LLAMA_CPP_ARCHITECTURES,
        window_at_load=True,
        # Prompt logprobs: the server scores generated tokens only. Embeddings need a server
        # started in embeddings-only mode: not served (its workloads are text only).
        # Images: through the card's projector (`--mmproj`), `multimodal_data` on /completion.
        features=frozenset(Feature) - {Feature.PROMPT_LOGPROBS},
        binary_env="SKULK_LLAMA_SERVER_BIN",
        managed_build=True,
        vendor_computes=_GGUF_COMPUTES,
        # Four slots let four clients decode together while a small model's KV for 4 x its
        # context still fits beside the weights; above 64 the per-slot context and the
        # dispatcher's thread count stop making sense.
        slots=SlotTraits("SKULK_LLAMA_SERVER_PARALLEL", default=4, maximum=64, kv_per_slot=True),
        kv_cache_types=("f16", "q8_0", "q4_0"),
        speculative=("ngram", "draft"),
    ),
    "mlx": EngineTraits(
        formats=frozenset({"safetensors"}),
        # Any model type mlx-lm loads runs on one rank (the whole mlx-lm model); a family
        # with a layer adapter (skulk.worker.engines.mlx.family) also spans ranks.
        families=MLX_FAMILIES,
        multi_node=True,
        # The families skulk.worker.engines.mlx.family has a layer/tensor layout for.
        sharded_families=frozenset({"llama", "mistral", "qwen2", "qwen3"}),
        # Rank 0 shapes the logits (skulk.worker.engines.mlx.sampling.TokenChooser: logprobs,
        # llguidance grammars, penalties, bias) where it computes them: on one rank or in a
        # tensor group. A pipeline's last rank samples without the tokenizer or the prompt,
        # so a pipeline serves plain sampling only. The stage computes the head for the last
        # position only, so no prompt logprobs. No MLX embedding path: text only.
        # Images only on the vision path below.
        features=frozenset(Feature) - {Feature.PROMPT_LOGPROBS, Feature.IMAGES},
        pipeline_features=frozenset({Feature.N}),
        # A card that sees loads through mlx-vlm (skulk.worker.engines.mlx.vision), whole on
        # one rank, sampling plainly: images and several choices; no logprobs, grammars,
        # penalties or bias.
        vision_features=frozenset({Feature.IMAGES, Feature.N}),
        vision_families=MLX_VLM_VISION_TYPES,
        # MLX needs mlx-lm for its model implementations; on Linux mlx[cpu] serves on CPU.
        modules=("mlx", "mlx_lm"),
        vendor_computes=_APPLE_COMPUTES,
        ranks_dial=True,
        # Prompt lookup, or a safetensors draft model of the same tokenizer (the card's
        # served_spec_draft_repo), on one whole-model rank, one request at a time
        # (mlx.speculate, mlx.draft_model).
        speculative=("ngram", "draft"),
        # mlx-lm's QuantizedKVCache (8 or 4 bits) on every rank, batched on one rank through
        # skulk's batch cache for it (mlx.kv_quant).
        kv_cache_types=("f16", "q8_0", "q4_0"),
    ),
    # Speech to text: Whisper models converted to CTranslate2, through faster-whisper (CPU on
    # any machine, CUDA on NVIDIA; CTranslate2 has no Metal, so a Mac transcribes on its CPU).
    # One request at a time per runner; never spans nodes.
    "faster_whisper": EngineTraits(formats=frozenset({"ctranslate2"}), families=frozenset({"whisper"}),
                                   workloads=frozenset({"transcription"}), modules=("faster_whisper",),
                                   vendor_computes=MappingProxyType({"nvidia": "cuda"})),
    # Speech to text on a Mac's GPU: Whisper models in mlx-whisper's layout (the
    # mlx-community `whisper-*-mlx` repos), through mlx-whisper (Apple's mlx-examples Whisper)
    # on Metal; elsewhere MLX's CPU backend serves them (how Linux tests run it). mlx-whisper
    # transcribes a whole file in one call: no partial results (its cards declare
    # supports_streaming false), and a cancel takes effect when the call returns. One request
    # at a time per runner; never spans nodes.
    "mlx_whisper": EngineTraits(formats=frozenset({"mlx_whisper"}), families=frozenset({"whisper"}),
                                workloads=frozenset({"transcription"}), modules=("mlx", "mlx_whisper"),
                                vendor_computes=_APPLE_COMPUTES),
    # Text to speech: Piper voices (VITS exported to ONNX), through piper-tts and ONNX
    # Runtime on CPU, on any machine; espeak-ng's phoneme data ships inside the wheel.
    "piper": EngineTraits(formats=frozenset({"onnx"}), families=frozenset({"vits"}),
                          workloads=frozenset({"speech"}), modules=("piper",)),
    # Skulk's vLLM path passes no logprobs, grammars, penalties or biases yet. GPU-only: no
    # CPU floor. It pages one shared KV pool between its sequences, so more sequences cost
    # no more memory.
    "vllm": EngineTraits(formats=frozenset({"safetensors", "gguf"}), window_at_load=True,
                         features=frozenset({Feature.N}),
                         binary_env="SKULK_VLLM_BIN",
                         vendor_computes=MappingProxyType({"nvidia": "cuda", "amd": "rocm"}),
                         cpu_floor=False,
                         slots=SlotTraits("SKULK_VLLM_MAX_CONCURRENT_REQUESTS", default=16, maximum=256),
                         context_cap_tokens=VLLM_CONTEXT_CAP_TOKENS,
                         speculative=("ngram",)),
})
"""Every runner engine a backend tag may name (the part before the first '-')."""


def serves_workload(engine: str, kind: str) -> bool:
    """Whether `engine` (a bare engine name) serves workload `kind`."""
    return kind in traits_of(engine).workloads


def engines_where(predicate: Callable[[EngineTraits], bool]) -> frozenset[str]:
    return frozenset(name for name, traits in ENGINE_TRAITS.items() if predicate(traits))


KNOWN_ENGINES: frozenset[str] = frozenset(ENGINE_TRAITS)
_ONLY_GGUF: frozenset[ArtifactFormat] = frozenset({"gguf"})
_ONLY_SAFETENSORS: frozenset[ArtifactFormat] = frozenset({"safetensors"})
GGUF_ENGINES: frozenset[str] = engines_where(lambda t: t.formats == _ONLY_GGUF)
"""Engines that load only GGUF files: a card listing one of them describes a GGUF artifact."""
SAFETENSORS_ONLY_ENGINES: frozenset[str] = engines_where(lambda t: t.formats == _ONLY_SAFETENSORS)
"""Engines that cannot load GGUF at all (mlx-lm reads HF safetensors directories)."""
MULTI_NODE_ENGINES: frozenset[str] = engines_where(lambda t: t.multi_node)
WINDOW_AT_LOAD_ENGINES: frozenset[str] = engines_where(lambda t: t.window_at_load)
SERVED_ENGINES: frozenset[str] = engines_where(lambda t: t.served)
"""Engines the runner serves through a separate server process."""
RING_ENGINES: frozenset[str] = engines_where(lambda t: t.ranks_dial)
"""Engines whose ranks dial each other: MLX's ring, and a llama.cpp pool, whose driver
dials each donor's authenticated pool channel (`skulk.pool.channel`) at its host."""
ENGINE_BINARY_ENV: Mapping[str, str] = MappingProxyType(
    {name: t.binary_env for name, t in ENGINE_TRAITS.items() if t.binary_env is not None})
"""Served engines and the node setting an operator (or provisioning) points at their binary."""
SLOTTED_ENGINES: Mapping[str, SlotTraits] = MappingProxyType(
    {name: t.slots for name, t in ENGINE_TRAITS.items() if t.slots is not None})
"""Served engines that decode several requests at once, with their slot facts."""
SERVED_TWIN: Mapping[str, str] = MappingProxyType(
    {name: t.served_twin for name, t in ENGINE_TRAITS.items() if t.served_twin is not None})
"""In-process engine -> the served engine that reads the same artifacts, many at a time."""
PROBED_MODULES: tuple[str, ...] = tuple(dict.fromkeys(m for t in ENGINE_TRAITS.values() for m in t.modules))
"""Python packages whose importability decides which in-process engines a node can run."""


def traits_of(engine: str) -> EngineTraits:
    """The traits of `engine` (a bare engine name); an unknown one has none of the features."""
    return ENGINE_TRAITS.get(engine, EngineTraits(formats=frozenset()))


def is_pool_donor(engine: str, rank: int) -> bool:
    """Whether rank `rank` of an instance on `engine` lends memory rather than runs it."""
    return rank > 0 and traits_of(engine).pool_donors


def context_cap(engine: str) -> int | None:
    """The most context an instance on `engine` serves whatever its card says (None: no cap)."""
    return traits_of(engine).context_cap_tokens


def loads_family(engine: str, family: str) -> bool:
    """Whether `engine` can load a model of `family` at all."""
    families = traits_of(engine).families
    return families is None or family in families


def shards_family(engine: str, family: str) -> bool:
    """Whether `engine` can spread one instance of a `family` model over several nodes."""
    traits = traits_of(engine)
    if not traits.multi_node:
        return False
    return traits.sharded_families is None or family in traits.sharded_families


def on_vision_path(engine: str, family: str, sees: bool) -> bool:
    """Whether a model of `family` whose card does (`sees`) or does not see runs on
    `engine`'s vision path (its `vision_features` apply)."""
    traits = traits_of(engine)
    return sees and traits.vision_features is not None and family in traits.vision_families


def shards_model(engine: str, family: str, sees: bool) -> bool:
    """Whether `engine` can spread one instance of a `family` model over several nodes,
    for a card that does (`sees`) or does not see: an engine's vision path runs on one node."""
    return shards_family(engine, family) and not on_vision_path(engine, family, sees)


def spans_with(engine: str, sharding: str) -> bool:
    """Whether a multi-node instance of `engine` may use `sharding` (llama.cpp pools by
    layer ranges only: Pipeline)."""
    return sharding in traits_of(engine).span_shardings


def required_features(params: TextGenerationParams) -> list[tuple[Feature, str]]:
    """The features `params` asks for, each with the (internal) parameter that asks, in a
    fixed order so the first refusal is stable."""
    from skulk.shared.tool_grammar import forced_tools

    # Images count too when only counting: only an engine that sees knows what they cost.
    images = [(Feature.IMAGES, "messages")] if any(message.images for message in params.messages) else []
    if params.count_only:
        return images  # nothing is generated: every engine counts its (text) prompt tokens
    wanted: list[tuple[Feature, str]] = []
    if params.logprobs:
        wanted.append((Feature.LOGPROBS, "logprobs"))
    if params.prompt_logprobs:
        wanted.append((Feature.PROMPT_LOGPROBS, "echo"))
    if params.response_format is not None:
        wanted.append((Feature.STRUCTURED_OUTPUT, "response_format"))
    if forced_tools(params.tools, params.tool_choice):
        wanted.append((Feature.FORCED_TOOL_CALLS, "tool_choice"))
    for name in ("frequency_penalty", "presence_penalty", "repeat_penalty"):
        if getattr(params, name) is not None:
            wanted.append((Feature.PENALTIES, name))
            break
    if params.logit_bias:
        wanted.append((Feature.LOGIT_BIAS, "logit_bias"))
    return wanted + images


def sees_images(engine: str, family: str | None = None) -> bool:
    """Whether `engine` (a bare engine name), or the served twin placement puts first,
    serves image inputs; with `family`, also through its vision path for that family."""
    traits = traits_of(engine)
    twin = traits.served_twin
    return (Feature.IMAGES in traits.features
            or (family is not None and on_vision_path(engine, family, True)
                and Feature.IMAGES in (traits.vision_features or frozenset()))
            or (twin is not None and Feature.IMAGES in traits_of(twin).features))


def honoured_features(engine: str, *, pipelined: bool = False, vision: bool = False) -> frozenset[Feature]:
    """The features `engine` honours, for an instance that is (`pipelined`) or is not a
    pipeline over several ranks, and is (`vision`, see `on_vision_path`) or is not on its
    vision path."""
    traits = traits_of(engine)
    if vision and traits.vision_features is not None:
        return traits.vision_features
    if pipelined and traits.pipeline_features is not None:
        return traits.pipeline_features
    return traits.features


def is_pipelined(sharding: str, world_size: int) -> bool:
    """Whether an instance runs as a pipeline over several ranks."""
    return world_size > 1 and sharding == "Pipeline"


def missing_features(engine: str, params: TextGenerationParams, *,
                     pipelined: bool = False, vision: bool = False) -> list[tuple[Feature, str]]:
    """The features `params` asks for that `engine` does not honour (empty: serve it), on
    (`vision`) or off its vision path."""
    have = honoured_features(engine, pipelined=pipelined, vision=vision)
    return [(feature, param) for feature, param in required_features(params) if feature not in have]


__all__ = [
    "ENGINE_BINARY_ENV",
    "ENGINE_TRAITS",
    "GGUF_ENGINES",
    "KNOWN_ENGINES",
    "MLX_FAMILIES",
    "MLX_VLM_VISION_TYPES",
    "MULTI_NODE_ENGINES",
    "PROBED_MODULES",
    "RING_ENGINES",
    "SAFETENSORS_ONLY_ENGINES",
    "SERVED_ENGINES",
    "SERVED_TWIN",
    "SLOTTED_ENGINES",
    "SPEECH_FORMATS",
    "VLLM_CONTEXT_CAP_TOKENS",
    "WINDOW_AT_LOAD_ENGINES",
    "ArtifactFormat",
    "EngineTraits",
    "Feature",
    "SlotTraits",
    "context_cap",
    "honoured_features",
    "is_pipelined",
    "is_pool_donor",
    "loads_family",
    "missing_features",
    "on_vision_path",
    "required_features",
    "sees_images",
    "serves_workload",
    "shards_family",
    "shards_model",
    "spans_with",
    "traits_of",
]
