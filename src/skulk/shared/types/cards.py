"""Model cards: what a model *is*, as placement, engines and the capacity planner need it.

A card is a description, never a policy. It states the model's shape (layers, heads, window
pattern, size), the artifacts it is made of (Hugging Face repo, GGUF file, revision pin,
local path) and which engines can run those artifacts. It must never encode a gap in our own
implementation (that lives in code-level capability tables) nor compute costs (the capacity
planner owns KV arithmetic, placement owns memory fits). Cards arrive as snake_case TOML
(`skulk.models.cards` loads them) and travel on the wire as camelCase like every `WireModel`.

Every validator raises a `card_field` error naming the offending field, so the loader can
tell a user exactly which key of which file to fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Annotated, Literal, cast

from pydantic import AfterValidator, ConfigDict, Field, Strict, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from skulk.shared.types.base import WireModel
from skulk.shared.types.engines import (  # the engine vocabularies derive from the traits table
    GGUF_ENGINES,
    KNOWN_ENGINES,
    SAFETENSORS_ONLY_ENGINES,
    SPEECH_FORMATS,
    ArtifactFormat,
    traits_of,
)
from skulk.shared.types.ids import ModelId
from skulk.shared.types.kv_cache import parse_kv_cache_type

# ---------------------------------------------------------------------------------------
# Vocabularies. Extending one of these is a schema change on purpose: a card naming an
# engine or family this build does not know must fail loudly, not land nowhere silently.
# ---------------------------------------------------------------------------------------

Family = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
"""The architecture as its engine names it: a GGUF's `general.architecture` ('qwen3moe'), a
config.json's `model_type` ('qwen3_moe'). Which names a card may carry is a fact of the
engines it lists (`skulk.shared.types.engine_architectures`, generated from them), checked
below; there is no list of ours."""
ModelTask = Literal["TextGeneration", "Embedding", "Transcription", "SpeechSynthesis"]
Capability = Literal["text", "tools", "thinking", "vision", "embedding", "stt", "tts"]
"""`stt`: speech to text (task Transcription); `tts`: text to speech (task
SpeechSynthesis). A speech card describes its audio in its `audio` section."""
CardSource = Literal["huggingface", "local-generated", "local-path"]
ToolCallFormat = Literal["hermes", "llama3_json", "mistral", "harmony", "none"]
ReasoningFormat = Literal["none", "think_tags", "harmony"]
ReasoningSwitch = Literal["enable_thinking", "thinking", "reasoning_effort"]
"""Chat-template variables that turn reasoning on or off (`enable_thinking`: Qwen 3;
`thinking`: DeepSeek V3.1, Granite) or set its level (`reasoning_effort`: gpt-oss)."""

KNOWN_COMPUTES: frozenset[str] = frozenset({"metal", "cuda", "rocm", "vulkan", "cpu"})
"""Accelerators a backend tag may name (the part after the first '-')."""

LOCAL_MODEL_PREFIX = "local/"
"""Model ids under this owner never touch the hub: they are generated or read from disk."""

_REPO_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_MODEL_ID_RE = re.compile(rf"^{_REPO_PART}/{_REPO_PART}$")
_REVISION_RE = re.compile(r"^[0-9a-f]{40}$")


def card_field_error(field: str, message: str) -> PydanticCustomError:
    """A validation error that names its field (dotted, snake_case) in `ctx['field']`."""
    return PydanticCustomError("card_field", "{message}", {"field": field, "message": message})


def backend_engine(tag: str) -> str:
    """The engine part of a backend tag: 'llama_cpp-cuda' -> 'llama_cpp', 'mlx' -> 'mlx'."""
    return tag.split("-", 1)[0]


def windowed_layer(layer_index: int, num_layers: int, sliding_window: int | None,
                   sliding_window_pattern: int | None) -> bool:
    """Whether layer `layer_index` (0-based) of a model with this attention layout uses the
    sliding window: none without a window, every layer without a pattern, else all but every
    `sliding_window_pattern`-th (which is global). The one copy of the rule that cards and
    the capacity planner's model shapes both apply."""
    if not 0 <= layer_index < num_layers:
        raise IndexError(f"layer {layer_index} out of range for {num_layers} layers")
    if sliding_window is None:
        return False
    if sliding_window_pattern is None:
        return True
    return (layer_index + 1) % sliding_window_pattern != 0


def is_model_id(value: str) -> bool:
    """'owner/name' as Hugging Face spells repo ids. Hugging Face forbids '--' and '..' in
    them; relying on that keeps the card file name ('/' -> '--') unambiguous and reversible."""
    return bool(_MODEL_ID_RE.match(value)) and "--" not in value and ".." not in value


def _check_model_id(value: str) -> str:
    if not is_model_id(value):
        raise ValueError(
            f"{value!r} is not a model id: expected 'owner/name' of letters, digits, '.', '_' "
            "and '-', without '--' or '..'"
        )
    return value


def _check_backend_tag(value: str) -> str:
    engine, sep, compute = value.partition("-")
    if engine not in KNOWN_ENGINES:
        raise ValueError(f"backend tag {value!r} names unknown engine {engine!r} (known: {sorted(KNOWN_ENGINES)})")
    if sep and compute not in KNOWN_COMPUTES:
        raise ValueError(
            f"backend tag {value!r} names unknown compute {compute!r} (known: {sorted(KNOWN_COMPUTES)})"
        )
    return value


def _check_gguf_file(value: str) -> str:
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or "\\" in value or not value.lower().endswith(".gguf"):
        raise ValueError(f"{value!r} must be a repo-relative path ending in .gguf")
    return value


def _check_onnx_file(value: str) -> str:
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or "\\" in value or not value.lower().endswith(".onnx"):
        raise ValueError(f"{value!r} must be a repo-relative path ending in .onnx")
    return value


def _check_revision(value: str) -> str:
    if not _REVISION_RE.match(value):
        raise ValueError(f"{value!r} is not an immutable commit pin (40 lowercase hex digits); branches and tags move")
    return value


def _check_absolute(value: str) -> str:
    if not PurePosixPath(value).is_absolute() and not re.match(r"^[A-Za-z]:[\\/]", value):
        raise ValueError(f"{value!r} must be an absolute path")
    return value


def _check_kv_backend(value: str) -> str:
    return parse_kv_cache_type(value)


def _unique(values: tuple[str, ...]) -> tuple[str, ...]:
    duplicates = sorted({v for v in values if values.count(v) > 1})
    if duplicates:
        raise ValueError(f"duplicate entries {duplicates}")
    return values


# Strict scalars: TOML already gives native types, so a quoted "16" where a count belongs is a
# mistake to report, not a value to coerce.
PositiveInt = Annotated[int, Strict(), Field(gt=0)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]
NonEmptyStr = Annotated[str, Strict(), Field(min_length=1)]
StrictBool = Annotated[bool, Strict()]
CardModelId = Annotated[ModelId, Strict(), AfterValidator(_check_model_id)]
BackendTag = Annotated[str, Strict(), AfterValidator(_check_backend_tag)]
GgufFile = Annotated[str, Strict(), AfterValidator(_check_gguf_file)]
OnnxFile = Annotated[str, Strict(), AfterValidator(_check_onnx_file)]
Revision = Annotated[str, Strict(), AfterValidator(_check_revision)]
AbsolutePath = Annotated[str, Strict(), AfterValidator(_check_absolute)]
KvCacheBackend = Annotated[str, Strict(), AfterValidator(_check_kv_backend)]


class PlacementSection(WireModel):
    """Where the model may run. Placement and the worker read it; they own the decisions."""

    compatible_backends: Annotated[tuple[BackendTag, ...], Field(min_length=1), AfterValidator(_unique)]
    """Hard filter: '<engine>-<compute>' tags or bare engines. A node is eligible only if its
    advertised tags intersect this list. A bare engine ('mlx') matches a node advertising that
    bare engine, which every node running the engine does alongside its specific tags."""

    backend_preference: Annotated[tuple[BackendTag, ...], AfterValidator(_unique)] = ()
    """Soft order over a subset of compatible_backends, best first. Compatible tags absent
    from it rank after every listed one, in compatible_backends order (see
    `ModelCard.ordered_backends`)."""

    max_pipeline_split_layer: PositiveInt | None = None
    """Hard sharding bound: no pipeline stage boundary may be placed after this many layers
    (for architectures whose tail layers reuse KV from earlier ones). None = unconstrained."""

    supports_tensor: StrictBool = False
    """The architecture can be split within a layer (tensor parallel) across ranks."""

    @model_validator(mode="after")
    def _preference_within_compatible(self) -> PlacementSection:
        for tag in self.backend_preference:
            if tag not in self.compatible_backends:
                raise card_field_error("backend_preference", f"{tag!r} is not in compatible_backends")
        return self


REMOVED_RUNTIME_KNOBS: Mapping[str, str] = {
    "speculative_multi_node": "Skulk speculates on one node only (llama-server's n-gram or draft-model "
                              "drafting, runtime.speculative), so there is no multi-node speculation to gate",
}
"""Runtime knobs older cards may still set, each with why it is gone: refused by name rather
than parsed and ignored."""


def refuse_removed(data: object, removed: Mapping[str, str], prefix: str = "") -> object:
    """`data` unchanged, or a ValueError naming the first removed key it sets (snake or camel
    case) and why it is gone."""
    keys = set(cast("dict[str, object]", data)) if isinstance(data, dict) else set[str]()
    for name, why in removed.items():
        if name in keys or to_camel(name) in keys:
            raise ValueError(f"{prefix}{name} was removed: {why}; delete it from the card")
    return cast("object", data)


REMOVED_CARD_FIELDS: Mapping[str, str] = {
    "mtp_sidecar_repo": "no engine Skulk runs loads separately shipped multi-token-prediction heads; "
                        "speculate with runtime.speculative = 'ngram', or 'draft' and served_spec_draft_*",
    "assistant_model_repo": "no engine Skulk runs loads an assistant drafter repo; name the draft with "
                            "served_spec_draft_repo (and served_spec_draft_file on a GGUF card) and "
                            "served_spec_draft_size_bytes, and set runtime.speculative = 'draft'",
}
"""Card fields older cards may still set, each with why it is gone: refused by name rather
than downloaded and loaded by nothing."""


class RuntimeSection(WireModel):
    """Per-model engine knobs. None everywhere means 'use the cluster / node default'; only
    an explicit value overrides it."""

    metal_fast_synch: StrictBool | None = None
    """Metal FAST_SYNCH pin; False for models that deadlock or slow down with it."""

    flash_attn: StrictBool | None = None
    """llama.cpp Flash Attention pin; the node default is on."""

    kv_cache_backend: KvCacheBackend | None = None
    """The KV cache element type this model is placed with unless a placement names one:
    'f16', 'q8_0' or 'q4_0' (`skulk.shared.types.kv_cache`; 'default' reads as f16)."""

    speculative: Literal["none", "ngram", "draft"] | None = None
    """Speculative decoding for this model (`skulk.shared.types.speculative`): 'ngram'
    drafts from n-grams already in the context (no second model); 'draft' runs the card's
    `served_spec_draft_*` model ahead of it; 'none' or unset: off. Placement serves a card
    that asks for it only on an engine that can (`speculative` in the engine traits table:
    llama-server and MLX both; vLLM n-gram only), on one node."""

    @model_validator(mode="before")
    @classmethod
    def _removed_knobs(cls, data: object) -> object:
        return refuse_removed(data, REMOVED_RUNTIME_KNOBS, "runtime.")


VoiceName = Annotated[str, Strict(), Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
LanguageCode = Annotated[str, Strict(), Field(min_length=2, max_length=3, pattern=r"^[a-z]{2,3}$")]
"""ISO 639-1 (or -3) language code, lower case: 'en', 'de', 'yue'."""


class AudioSection(WireModel):
    """What a speech model truly supports; every speech route gates on it (a request for
    something the card does not declare is a typed 400, never a silent fallback). Set
    exactly when the card's capabilities include 'stt' or 'tts'."""

    sample_rate: PositiveInt
    """Hz. Speech to text: the rate the model hears (uploads are resampled to it). Text to
    speech: the rate it speaks at (the PCM the runner returns)."""
    languages: Annotated[tuple[LanguageCode, ...], AfterValidator(_unique)] = ()
    """Languages it transcribes or speaks; empty: any its tokenizer knows (a multilingual
    Whisper), which the engine checks."""
    supports_translation: StrictBool = False
    """Speech to text: it can translate speech into English text (/v1/audio/translations)."""
    supports_streaming: StrictBool = False
    """Speech to text: it returns the transcript segment by segment as it decodes
    (`stream=true`). Text to speech: it returns audio sentence by sentence before the whole
    input is synthesized."""
    supports_realtime: StrictBool = False
    """Speech to text: it serves realtime sessions (WS /v1/realtime): short committed
    utterances, transcribed as they close."""
    supports_word_timestamps: StrictBool = False
    """Speech to text: it gives a start and end time per word (verbose_json's `words`)."""
    voices: Annotated[tuple[VoiceName, ...], AfterValidator(_unique)] = ()
    """Text to speech: the voices it speaks with (required, at least one)."""
    default_voice: VoiceName | None = None
    """Text to speech: the voice used when a request names none; one of `voices`."""


class ToolingSection(WireModel):
    """How the model's chat template expresses tool calls; the family adapter parses it."""

    tool_call_format: ToolCallFormat = "none"


class ReasoningSection(WireModel):
    """How the model marks its reasoning in the output stream."""

    format: ReasoningFormat = "none"
    start_tag: NonEmptyStr | None = None
    """For think_tags: the opening marker, e.g. '<think>'."""
    end_tag: NonEmptyStr | None = None
    """For think_tags: the closing marker, e.g. '</think>'."""
    switches: Annotated[tuple[ReasoningSwitch, ...], AfterValidator(_unique)] = ()
    """The template variables that control reasoning: what a request's thinking on/off or
    effort is rendered through. Empty: the model's reasoning cannot be switched."""

    @model_validator(mode="after")
    def _tags_match_format(self) -> ReasoningSection:
        if self.format == "think_tags":
            for name in ("start_tag", "end_tag"):
                if getattr(self, name) is None:
                    raise card_field_error(name, "required when format is 'think_tags'")
        else:
            for name in ("start_tag", "end_tag"):
                if getattr(self, name) is not None:
                    raise card_field_error(name, f"only meaningful when format is 'think_tags', not {self.format!r}")
        if self.switches and self.format == "none":
            raise card_field_error("switches", "a model that does not reason has no reasoning switches")
        return self


class ModelCard(WireModel):
    """One model: identity, shape, artifacts, and where it may run.

    Attention layout (the capacity planner depends on this exact rule). Layers are indexed
    0..num_layers-1; each layer is either *global* (attends to the whole context) or
    *windowed* (attends to at most `sliding_window` most recent tokens):

    - sliding_window None (then sliding_window_pattern must be None): every layer is global.
    - sliding_window W, sliding_window_pattern None: every layer is windowed to W.
    - sliding_window W, sliding_window_pattern N: layer i is global iff (i + 1) % N == 0, and
      windowed to W otherwise. Gemma 3 (N=6): layers 5, 11, 17, ... are global, five windowed
      layers precede each. Gemma 2 (N=2): odd layers global, even layers windowed.

    `is_windowed_layer` is the executable form of this rule.
    """

    model_config = ConfigDict(protected_namespaces=())

    model_id: CardModelId
    """Hugging Face repo id ('mlx-community/Llama-3.2-1B-Instruct-4bit'), or 'local/<name>'
    for models generated by the project or read from a local path."""
    name: NonEmptyStr
    """Display name."""
    family: Family
    """Architecture: GGUF `general.architecture` or config.json `model_type`. Every engine
    the card lists must load it; sharding over nodes may need a per-family layout."""

    source: CardSource = "huggingface"
    """Where the artifacts come from. huggingface: downloaded from the hub (or the store);
    local-generated: produced offline by the project's generator; local-path: already on disk
    at local_path."""
    source_revision: Revision | None = None
    """Immutable hub commit the artifacts are pinned to; part of artifact identity. None =
    the repo's main branch. Only for source = huggingface."""
    local_path: AbsolutePath | None = None
    """Absolute directory on the node's disk holding the artifacts (the safetensors model, or
    the directory containing gguf_file); only for source = local-path."""
    gguf_file: GgufFile | None = None
    """Exact GGUF file this card means, relative to the repo (or local_path); the first shard
    for split files. Required for GGUF cards unless source = local-generated; forbidden for
    safetensors cards."""
    onnx_file: OnnxFile | None = None
    """Exact ONNX model this card means, relative to the repo (or local_path), its JSON
    config beside it (the same path plus '.json': a Piper voice). One hub repo can hold many
    voices (rhasspy/piper-voices), so a hub ONNX card must name its file; forbidden for
    cards of other formats and for generated ones (the generator names its file)."""
    quantization: NonEmptyStr
    """As published: '4bit', '8bit', 'bf16' (MLX), 'Q4_K_M', 'Q8_0', 'f16' (GGUF)."""
    storage_size_bytes: PositiveInt
    """Bytes of the artifacts this card downloads/loads: the whole repo for safetensors, the
    named gguf_file for GGUF (not the repo, which holds every quant)."""

    # Companion repos: artifacts no instance names but a runner of this model loads. Each is
    # optional (None = none); `skulk.models.companions.companion_download_specs` is the one
    # place that turns them into downloads and says which are required.
    served_spec_draft_repo: CardModelId | None = None
    """Hub repo of the draft model when `runtime.speculative` is 'draft' (then required;
    otherwise never downloaded): for a GGUF card, the repo of the draft GGUF llama-server
    takes as --model-draft; for a safetensors (MLX) card, a safetensors repo of the same
    tokenizer, downloaded whole and loaded by the MLX engine beside the target."""
    served_spec_draft_file: GgufFile | None = None
    """The draft GGUF file in served_spec_draft_repo: set exactly when that repo is on a
    GGUF card, never on a safetensors card (its draft is the whole repo)."""
    served_spec_draft_size_bytes: PositiveInt | None = None
    """Bytes of the draft (its GGUF file, or the safetensors repo's weights): placement
    admits the draft (and its KV cache) with the target. Set exactly when
    served_spec_draft_repo is."""
    vision_weights_repo: CardModelId | None = None
    """Hub repo of split vision weights (required: a vision model cannot load without them)."""
    vision_weights_file: GgufFile | None = None
    """The vision GGUF (an mmproj file) in vision_weights_repo; None = a safetensors repo."""
    vision_weights_size_bytes: PositiveInt | None = None
    """Bytes of the multimodal projector (the mmproj GGUF) a llama.cpp engine loads beside the
    model: vision_weights_file, or a generated GGUF vision card's own mmproj.gguf. Placement
    admits it on the rank that loads it (rank 0: `skulk.shared.memory_estimate.projector_bytes`).
    Only for a card with such a projector; the card builder always fills it. Optional on the
    wire (cards logged before it existed still replay); such a card is admitted without it."""

    tasks: Annotated[tuple[ModelTask, ...], Field(min_length=1), AfterValidator(_unique)]
    capabilities: Annotated[tuple[Capability, ...], Field(min_length=1), AfterValidator(_unique)]

    num_layers: PositiveInt
    """Transformer blocks (config.json num_hidden_layers)."""
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt
    """KV heads (GQA); num_attention_heads must be a multiple of it."""
    head_dim: PositiveInt
    """Per-head dimension, stated explicitly: it is not always hidden_size / heads (Gemma 3).
    It is the key's; see value_head_dim."""
    value_head_dim: NonNegativeInt | None = None
    """Per-head dimension of the values when it differs from the keys' (GGUF
    `attention.value_length`, config `v_head_dim`); None = head_dim; 0 = the engine caches
    keys only (llama.cpp's MLA latent, see skulk.shared.kv_shape). KV sizing counts both."""
    num_experts: Annotated[int, Strict(), Field(ge=2)] | None = None
    """Experts per MoE layer (None: a dense model). Every expert's weights are loaded, so
    memory counts them all (storage_size_bytes already does)."""
    num_experts_used: PositiveInt | None = None
    """Experts each token is routed through; set exactly when num_experts is."""
    total_parameters: PositiveInt | None = None
    """Parameters in the weights, when the builder could count them (GGUF tensor table)."""
    active_parameters: PositiveInt | None = None
    """Parameters one token computes through: total less the unused experts' share."""
    vocab_size: PositiveInt
    context_length: PositiveInt
    """Largest context the model was trained/published for, in tokens."""
    sliding_window: PositiveInt | None = None
    """Window of windowed layers, in tokens; see the class docstring."""
    sliding_window_pattern: Annotated[int, Strict(), Field(ge=2)] | None = None
    """Period N of the global/windowed interleave; see the class docstring."""

    placement: PlacementSection
    runtime: RuntimeSection = RuntimeSection()
    tooling: ToolingSection = ToolingSection()
    reasoning: ReasoningSection = ReasoningSection()
    audio: AudioSection | None = None
    """Set exactly for a speech card (capabilities 'stt' or 'tts')."""

    # -- derived descriptions ------------------------------------------------------------

    @property
    def engines(self) -> frozenset[str]:
        """Engines named by compatible_backends ('llama_cpp-cuda' contributes 'llama_cpp')."""
        return frozenset(backend_engine(tag) for tag in self.placement.compatible_backends)

    @property
    def is_gguf(self) -> bool:
        """The artifact is a GGUF file (some compatible engine loads only GGUF)."""
        return bool(self.engines & GGUF_ENGINES)

    @property
    def artifact_format(self) -> ArtifactFormat:
        """The one format every engine the card lists loads (`_one_artifact_format` makes
        it one): GGUF, a speech model's own layout (`SPEECH_FORMATS`), or else a safetensors folder."""
        if self.is_gguf:
            return "gguf"
        shared = _shared_formats(self.engines)
        for speech_format in SPEECH_FORMATS:
            if speech_format in shared:
                return speech_format
        return "safetensors"

    @property
    def is_speech(self) -> bool:
        """A speech model (speech to text or text to speech): served by a speech engine."""
        return "stt" in self.capabilities or "tts" in self.capabilities

    @property
    def is_local(self) -> bool:
        """Resolved without the hub (generated or on-disk)."""
        return self.source != "huggingface"

    @property
    def ordered_backends(self) -> tuple[str, ...]:
        """compatible_backends, best first: backend_preference, then the rest in listed order."""
        preferred = self.placement.backend_preference
        return preferred + tuple(t for t in self.placement.compatible_backends if t not in preferred)

    def is_windowed_layer(self, layer_index: int) -> bool:
        """Whether layer `layer_index` (0-based) uses the sliding window (see class docstring)."""
        return windowed_layer(layer_index, self.num_layers, self.sliding_window, self.sliding_window_pattern)

    # -- cross-field rules, each naming the field to fix ----------------------------------

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data: object) -> object:
        return refuse_removed(data, REMOVED_CARD_FIELDS)

    @model_validator(mode="after")
    def _consistent(self) -> ModelCard:
        for rule in (
            _heads_divide,
            _window_pattern_needs_window,
            _split_layer_within_model,
            _one_artifact_format,
            _gguf_file_matches_format,
            _onnx_file_matches_format,
            _source_fields_match,
            _tasks_match_capabilities,
            _tooling_matches_capabilities,
            _reasoning_matches_capabilities,
            _audio_matches_capabilities,
            _companions_consistent,
            _engines_load_family,
            _experts_consistent,
        ):
            rule(self)
        return self


def _heads_divide(card: ModelCard) -> None:
    if card.num_attention_heads % card.num_key_value_heads != 0:
        raise card_field_error(
            "num_key_value_heads",
            f"num_attention_heads ({card.num_attention_heads}) is not a multiple of "
            f"num_key_value_heads ({card.num_key_value_heads})",
        )


def _window_pattern_needs_window(card: ModelCard) -> None:
    if card.sliding_window_pattern is not None and card.sliding_window is None:
        raise card_field_error("sliding_window_pattern", "set without sliding_window")


def _split_layer_within_model(card: ModelCard) -> None:
    limit = card.placement.max_pipeline_split_layer
    if limit is not None and limit > card.num_layers:
        raise card_field_error(
            "placement.max_pipeline_split_layer", f"{limit} exceeds num_layers ({card.num_layers})"
        )


def _shared_formats(engines: frozenset[str]) -> frozenset[ArtifactFormat]:
    """The artifact formats every one of `engines` loads."""
    shared: frozenset[ArtifactFormat] | None = None
    for engine in engines:
        formats = traits_of(engine).formats
        shared = formats if shared is None else shared & formats
    return shared or frozenset()


def _one_artifact_format(card: ModelCard) -> None:
    gguf, safetensors = card.engines & GGUF_ENGINES, card.engines & SAFETENSORS_ONLY_ENGINES
    if not _shared_formats(card.engines):
        raise card_field_error(
            "placement.compatible_backends",
            f"its engines {sorted(card.engines)} share no artifact format; one card describes one artifact",
        )
    if gguf and safetensors:
        raise card_field_error(
            "placement.compatible_backends",
            f"mixes GGUF-only engines {sorted(gguf)} with engines that cannot load GGUF "
            f"{sorted(safetensors)}; one card describes one artifact, make two cards",
        )


def _gguf_file_matches_format(card: ModelCard) -> None:
    # A generated model's file name is the generator's business; every other GGUF card must
    # say which of the repo's (or directory's) many quant files it means.
    if card.is_gguf and card.gguf_file is None and card.source != "local-generated":
        raise card_field_error("gguf_file", "required for a GGUF card (one with a llama_cpp/llama_server backend)")
    if not card.is_gguf and card.gguf_file is not None:
        raise card_field_error("gguf_file", "set on a card with no GGUF engine in compatible_backends")


def _onnx_file_matches_format(card: ModelCard) -> None:
    onnx = card.artifact_format == "onnx"
    if onnx and card.onnx_file is None and card.source == "huggingface":
        raise card_field_error("onnx_file", "required for an ONNX card from the hub (one repo holds many voices): "
                               "the repo-relative .onnx, its .onnx.json beside it")
    if card.onnx_file is not None and not onnx:
        raise card_field_error("onnx_file", "set on a card whose engines do not load ONNX")
    if card.onnx_file is not None and card.source == "local-generated":
        raise card_field_error("onnx_file", "a generated model's file is the generator's to name")


def _source_fields_match(card: ModelCard) -> None:
    local_id = card.model_id.startswith(LOCAL_MODEL_PREFIX)
    if card.source == "huggingface" and local_id:
        raise card_field_error("model_id", f"'{LOCAL_MODEL_PREFIX}...' ids are for local sources, not huggingface")
    if card.source != "huggingface" and not local_id:
        raise card_field_error("model_id", f"source {card.source!r} needs a '{LOCAL_MODEL_PREFIX}<name>' id")
    if card.source_revision is not None and card.source != "huggingface":
        raise card_field_error("source_revision", "only a huggingface source can be pinned to a commit")
    if card.source == "local-path" and card.local_path is None:
        raise card_field_error("local_path", "required when source is 'local-path'")
    if card.source != "local-path" and card.local_path is not None:
        raise card_field_error("local_path", f"only meaningful when source is 'local-path', not {card.source!r}")


def _tasks_match_capabilities(card: ModelCard) -> None:
    for task, capability in (("TextGeneration", "text"), ("Embedding", "embedding"), ("Transcription", "stt"),
                             ("SpeechSynthesis", "tts")):
        if (task in card.tasks) != (capability in card.capabilities):
            raise card_field_error(
                "capabilities", f"task {task!r} and capability {capability!r} must be declared together"
            )


def _tooling_matches_capabilities(card: ModelCard) -> None:
    has_format = card.tooling.tool_call_format != "none"
    if has_format != ("tools" in card.capabilities):
        raise card_field_error(
            "tooling.tool_call_format", "must be set (not 'none') exactly when capabilities include 'tools'"
        )


def _reasoning_matches_capabilities(card: ModelCard) -> None:
    has_format = card.reasoning.format != "none"
    if has_format != ("thinking" in card.capabilities):
        raise card_field_error(
            "reasoning.format", "must be set (not 'none') exactly when capabilities include 'thinking'"
        )


def _audio_matches_capabilities(card: ModelCard) -> None:
    audio = card.audio
    if card.is_speech != (audio is not None):
        raise card_field_error("audio", "set exactly when capabilities include 'stt' or 'tts' (a speech model)")
    if audio is None:
        return
    if "stt" in card.capabilities and "tts" in card.capabilities:
        raise card_field_error("capabilities", "one speech card is either 'stt' or 'tts'; make two cards")
    speaks = "tts" in card.capabilities
    if speaks and not audio.voices:
        raise card_field_error("audio.voices", "a text-to-speech card names at least one voice")
    if speaks and audio.default_voice is not None and audio.default_voice not in audio.voices:
        raise card_field_error("audio.default_voice", f"{audio.default_voice!r} is not one of audio.voices")
    if not speaks:
        for name in ("voices", "default_voice"):
            if getattr(audio, name):
                raise card_field_error(f"audio.{name}", "only a text-to-speech card has voices")
    if speaks:
        for name in ("supports_translation", "supports_realtime", "supports_word_timestamps"):
            if getattr(audio, name):
                raise card_field_error(f"audio.{name}", "only a speech-to-text card transcribes")


def _companions_consistent(card: ModelCard) -> None:
    for repo_field, file_field in (("served_spec_draft_repo", "served_spec_draft_file"),
                                   ("vision_weights_repo", "vision_weights_file")):
        if getattr(card, file_field) is not None and getattr(card, repo_field) is None:
            raise card_field_error(file_field, f"set without {repo_field}")
    drafts = card.served_spec_draft_repo is not None
    # A GGUF card's draft is one GGUF file of the repo (llama-server's --model-draft); a
    # safetensors card's (MLX) is the whole repo, loaded as an mlx-lm model.
    if drafts and card.served_spec_draft_size_bytes is None:
        raise card_field_error("served_spec_draft_size_bytes", "required with served_spec_draft_repo (the "
                               "draft's size, admitted for memory with the target)")
    if drafts and card.is_gguf and card.served_spec_draft_file is None:
        raise card_field_error("served_spec_draft_file", "required with served_spec_draft_repo on a GGUF card "
                               "(the draft GGUF file)")
    if card.served_spec_draft_file is not None and drafts and not card.is_gguf:
        raise card_field_error("served_spec_draft_file", "a safetensors (MLX) card drafts with a whole safetensors "
                               "repo of the same tokenizer: name served_spec_draft_repo without a file")
    if card.served_spec_draft_size_bytes is not None and not drafts:
        raise card_field_error("served_spec_draft_size_bytes", "set without served_spec_draft_repo")
    if card.runtime.speculative == "draft" and not drafts:
        raise card_field_error("runtime.speculative", "'draft' needs the draft model: set served_spec_draft_repo "
                               "(with served_spec_draft_file on a GGUF card) and served_spec_draft_size_bytes")
    if card.vision_weights_size_bytes is not None and not has_gguf_projector(card):
        raise card_field_error("vision_weights_size_bytes", "set without a projector: only a vision card with "
                               "vision_weights_file (or a generated GGUF vision card) loads one")
    for name in ("served_spec_draft_repo", "vision_weights_repo"):
        repo = getattr(card, name)
        if repo is None:
            continue
        if card.source != "huggingface":
            raise card_field_error(name, "companion repos come from the hub: only for source = huggingface")
        # A GGUF repo usually ships its projector beside the model: another file of the same
        # repo is a companion; the model's own file is not.
        same_repo_file = name == "vision_weights_repo" and card.vision_weights_file not in (None, card.gguf_file)
        if repo == card.model_id and not same_repo_file:
            raise card_field_error(name, "names the model's own repo")
        if repo.startswith(LOCAL_MODEL_PREFIX):
            raise card_field_error(name, f"'{LOCAL_MODEL_PREFIX}...' ids are not hub repos")


def has_gguf_projector(card: ModelCard) -> bool:
    """Whether a runner of `card` loads a multimodal projector GGUF beside the model: a vision
    card naming vision_weights_file, or a generated GGUF vision card (its mmproj.gguf)."""
    if "vision" not in card.capabilities:
        return False
    return card.vision_weights_file is not None or (card.source == "local-generated" and card.is_gguf)


def _engines_load_family(card: ModelCard) -> None:
    for engine in sorted(card.engines):
        known = traits_of(engine).families
        if known is not None and card.family not in known:
            raise card_field_error(
                "family", f"{card.family!r} is not an architecture the {engine} engine loads "
                f"(it loads {len(known)}: see skulk.shared.types.engine_architectures)")


def _experts_consistent(card: ModelCard) -> None:
    if (card.num_experts is None) != (card.num_experts_used is None):
        raise card_field_error("num_experts_used", "set exactly when num_experts is (a mixture of experts)")
    if card.num_experts is not None and card.num_experts_used is not None and card.num_experts_used > card.num_experts:
        raise card_field_error("num_experts_used", f"{card.num_experts_used} exceeds num_experts ({card.num_experts})")
    if card.active_parameters is not None and (card.total_parameters is None
                                               or card.active_parameters > card.total_parameters):
        raise card_field_error("active_parameters", "needs total_parameters, and cannot exceed it")


__all__ = [
    "GGUF_ENGINES",
    "KNOWN_COMPUTES",
    "KNOWN_ENGINES",
    "LOCAL_MODEL_PREFIX",
    "SAFETENSORS_ONLY_ENGINES",
    "ArtifactFormat",
    "AudioSection",
    "Capability",
    "CardSource",
    "Family",
    "ModelCard",
    "ModelTask",
    "PlacementSection",
    "ReasoningFormat",
    "ReasoningSection",
    "RuntimeSection",
    "ToolCallFormat",
    "ToolingSection",
    "backend_engine",
    "card_field_error",
    "has_gguf_projector",
    "is_model_id",
    "windowed_layer",
]
