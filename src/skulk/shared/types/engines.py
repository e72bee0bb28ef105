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

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from skulk.shared.types.tasks import TextGenerationParams

ArtifactFormat = Literal["safetensors", "gguf"]


class Feature(StrEnum):
    """A request feature an engine may or may not honour. The value reads as English, so
    an error can say "the mlx engine does not support structured output"."""

    LOGPROBS = "logprobs"
    STRUCTURED_OUTPUT = "structured output"
    FORCED_TOOL_CALLS = "forced tool calls"
    PENALTIES = "repetition penalties"
    LOGIT_BIAS = "logit bias"
    EMBEDDINGS = "embeddings"
    N = "several choices (n)"
    PROMPT_LOGPROBS = "prompt logprobs (echo with logprobs)"


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
    several ranks (None: the same as `features`).
    `families`: the model families it can load at all (None: any its formats hold);
    placement never puts a model of another family on it (it would only fail at load)."""

    formats: frozenset[ArtifactFormat]
    families: frozenset[str] | None = None
    multi_node: bool = False
    sharded_families: frozenset[str] | None = frozenset()
    span_shardings: frozenset[str] = frozenset({"Pipeline", "Tensor"})
    window_at_load: bool = False
    features: frozenset[Feature] = frozenset()
    pipeline_features: frozenset[Feature] | None = None


ENGINE_TRAITS: Mapping[str, EngineTraits] = MappingProxyType({
    "llama_cpp": EngineTraits(
        formats=frozenset({"gguf"}),
        # Pooled over llama.cpp's RPC backend (skulk.pool): rank 0 drives, the other ranks
        # lend their memory as ggml RPC servers; layers split in contiguous ranges.
        multi_node=True,
        sharded_families=None,
        span_shardings=frozenset({"Pipeline"}),
        window_at_load=True,
        features=frozenset(Feature),
    ),
    "llama_server": EngineTraits(
        formats=frozenset({"gguf"}),
        window_at_load=True,
        # Embeddings need a server started in embeddings-only mode: not served. Prompt
        # logprobs: the server scores generated tokens only.
        features=frozenset(Feature) - {Feature.EMBEDDINGS, Feature.PROMPT_LOGPROBS},
    ),
    "mlx": EngineTraits(
        formats=frozenset({"safetensors"}),
        # Any family mlx-lm loads runs on one rank (the whole mlx-lm model); a family with a
        # layer adapter (skulk.worker.engines.mlx.family) also spans ranks.
        families=None,
        multi_node=True,
        # The families skulk.worker.engines.mlx.family has a layer/tensor layout for.
        sharded_families=frozenset({"llama", "mistral", "qwen2", "qwen3"}),
        # Rank 0 shapes the logits (skulk.worker.engines.mlx.sampling.TokenChooser: logprobs,
        # llguidance grammars, penalties, bias) where it computes them: on one rank or in a
        # tensor group. A pipeline's last rank samples without the tokenizer or the prompt,
        # so a pipeline serves plain sampling only. Embeddings: no MLX embedding path; the
        # stage computes the head for the last position only, so no prompt logprobs.
        features=frozenset(Feature) - {Feature.EMBEDDINGS, Feature.PROMPT_LOGPROBS},
        pipeline_features=frozenset({Feature.N}),
    ),
    "mlx_audio": EngineTraits(formats=frozenset({"safetensors"})),
    # Skulk's vLLM path passes no logprobs, grammars, penalties or biases yet.
    "vllm": EngineTraits(formats=frozenset({"safetensors", "gguf"}), window_at_load=True,
                         features=frozenset({Feature.N})),
})
"""Every runner engine a backend tag may name (the part before the first '-')."""


def engines_where(predicate) -> frozenset[str]:
    return frozenset(name for name, traits in ENGINE_TRAITS.items() if predicate(traits))


KNOWN_ENGINES: frozenset[str] = frozenset(ENGINE_TRAITS)
GGUF_ENGINES: frozenset[str] = engines_where(lambda t: t.formats == {"gguf"})
"""Engines that load only GGUF files: a card listing one of them describes a GGUF artifact."""
SAFETENSORS_ONLY_ENGINES: frozenset[str] = engines_where(lambda t: t.formats == {"safetensors"})
"""Engines that cannot load GGUF at all (mlx-lm reads HF safetensors directories)."""
MULTI_NODE_ENGINES: frozenset[str] = engines_where(lambda t: t.multi_node)
WINDOW_AT_LOAD_ENGINES: frozenset[str] = engines_where(lambda t: t.window_at_load)


def traits_of(engine: str) -> EngineTraits:
    """The traits of `engine` (a bare engine name); an unknown one has none of the features."""
    return ENGINE_TRAITS.get(engine, EngineTraits(formats=frozenset()))


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


def spans_with(engine: str, sharding: str) -> bool:
    """Whether a multi-node instance of `engine` may use `sharding` (llama.cpp pools by
    layer ranges only: Pipeline)."""
    return sharding in traits_of(engine).span_shardings


def required_features(params: TextGenerationParams) -> list[tuple[Feature, str]]:
    """The features `params` asks for, each with the (internal) parameter that asks, in a
    fixed order so the first refusal is stable."""
    from skulk.shared.tool_grammar import forced_tools

    if params.count_only:
        return []  # nothing is generated: every engine counts its prompt tokens
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
    return wanted


def honoured_features(engine: str, *, pipelined: bool = False) -> frozenset[Feature]:
    """The features `engine` honours, for an instance that is (`pipelined`) or is not a
    pipeline over several ranks."""
    traits = traits_of(engine)
    if pipelined and traits.pipeline_features is not None:
        return traits.pipeline_features
    return traits.features


def is_pipelined(sharding: str, world_size: int) -> bool:
    """Whether an instance runs as a pipeline over several ranks."""
    return world_size > 1 and sharding == "Pipeline"


def missing_features(engine: str, params: TextGenerationParams, *,
                     pipelined: bool = False) -> list[tuple[Feature, str]]:
    """The features `params` asks for that `engine` does not honour (empty: serve it)."""
    have = honoured_features(engine, pipelined=pipelined)
    return [(feature, param) for feature, param in required_features(params) if feature not in have]


__all__ = [
    "ENGINE_TRAITS",
    "GGUF_ENGINES",
    "KNOWN_ENGINES",
    "MULTI_NODE_ENGINES",
    "SAFETENSORS_ONLY_ENGINES",
    "WINDOW_AT_LOAD_ENGINES",
    "ArtifactFormat",
    "EngineTraits",
    "Feature",
    "honoured_features",
    "is_pipelined",
    "loads_family",
    "missing_features",
    "required_features",
    "shards_family",
    "spans_with",
    "traits_of",
]
