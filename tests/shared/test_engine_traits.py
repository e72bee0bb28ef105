"""The engine traits table: the vocabularies derived from it, the features a request asks
for, and the table's agreement with the engines it describes."""

from __future__ import annotations

import pytest

from skulk.shared.types.common import ToolSpec
from skulk.shared.types.engines import (
    ENGINE_TRAITS,
    GGUF_ENGINES,
    MULTI_NODE_ENGINES,
    SAFETENSORS_ONLY_ENGINES,
    WINDOW_AT_LOAD_ENGINES,
    Feature,
    missing_features,
    required_features,
    shards_family,
)
from skulk.shared.types.tasks import ResponseFormat, TextGenerationParams

TOOL = ToolSpec(name="f", parameters={})


def params(**fields) -> TextGenerationParams:
    return TextGenerationParams(model_id="a/b", prompt="x", **fields)


def test_derived_vocabularies():
    assert {"llama_cpp", "llama_server"} == GGUF_ENGINES
    assert {"mlx"} == SAFETENSORS_ONLY_ENGINES
    assert {"mlx", "llama_cpp"} == MULTI_NODE_ENGINES
    assert {"llama_cpp", "llama_server", "vllm"} == WINDOW_AT_LOAD_ENGINES


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, []),
    ({"logprobs": True}, [(Feature.LOGPROBS, "logprobs")]),
    ({"response_format": ResponseFormat(type="json_object")}, [(Feature.STRUCTURED_OUTPUT, "response_format")]),
    ({"tools": [TOOL], "tool_choice": "required"}, [(Feature.FORCED_TOOL_CALLS, "tool_choice")]),
    ({"tools": [TOOL], "tool_choice": "auto"}, []),
    ({"presence_penalty": 0.0}, [(Feature.PENALTIES, "presence_penalty")]),
    ({"repeat_penalty": 1.1, "frequency_penalty": 1.0}, [(Feature.PENALTIES, "frequency_penalty")]),
    ({"logit_bias": {1: 2.0}}, [(Feature.LOGIT_BIAS, "logit_bias")]),
])
def test_required_features(fields, expected):
    assert required_features(params(**fields)) == expected


SHAPED = {"logprobs": True, "logit_bias": {1: 2.0}, "presence_penalty": 0.5,
          "response_format": ResponseFormat(type="json_object")}


@pytest.mark.parametrize(("engine", "fields", "pipelined", "missing"), [
    ("llama_cpp", {"logprobs": True, "logit_bias": {1: 2.0}}, False, []),
    ("mlx", SHAPED, False, []),
    # A pipeline's last rank samples, without the tokenizer or the prompt: plain sampling only.
    ("mlx", SHAPED, True, [Feature.LOGPROBS, Feature.STRUCTURED_OUTPUT, Feature.PENALTIES, Feature.LOGIT_BIAS]),
    ("mlx", {"tools": [TOOL], "tool_choice": "required"}, True, [Feature.FORCED_TOOL_CALLS]),
    ("mlx", {}, True, []),
    ("llama_cpp", {"logprobs": True}, True, []),  # no pipeline_features: the same as features
    ("vllm", {"logprobs": True}, False, [Feature.LOGPROBS]),
    ("no_such_engine", {"logit_bias": {1: 2.0}}, False, [Feature.LOGIT_BIAS]),
])
def test_missing_features(engine, fields, pipelined, missing):
    assert [feature for feature, _ in missing_features(engine, params(**fields), pipelined=pipelined)] == missing


@pytest.mark.parametrize(("sharding", "world", "pipelined"), [
    ("Pipeline", 1, False), ("Pipeline", 2, True), ("Tensor", 2, False), ("Tensor", 1, False),
])
def test_is_pipelined(sharding, world, pipelined):
    from skulk.shared.types.engines import is_pipelined

    assert is_pipelined(sharding, world) is pipelined


@pytest.mark.parametrize(("engine", "family", "spans"), [
    ("mlx", "llama", True), ("mlx", "qwen3", True), ("mlx", "gemma3", False), ("llama_cpp", "llama", True),
    ("llama_cpp", "gemma3", True), ("llama_server", "llama", False),
])
def test_shards_family(engine, family, spans):
    assert shards_family(engine, family) is spans


def test_the_mlx_row_matches_the_mlx_family_adapters():
    from skulk.worker.engines.mlx.family import FAMILIES

    assert ENGINE_TRAITS["mlx"].sharded_families == frozenset(FAMILIES)


@pytest.mark.parametrize(("engine", "family", "loads"), [
    ("mlx", "llama", True), ("mlx", "gemma3", True), ("mlx", "qwen3_moe", True), ("mlx", "mistral", True),
    ("mlx", "qwen3moe", False), ("mlx", "gpt9", False),
    ("llama_cpp", "gemma3", True), ("llama_cpp", "qwen3moe", True), ("llama_cpp", "gpt-oss", True),
    ("llama_server", "olmo2", True), ("llama_cpp", "qwen3_moe", False), ("llama_cpp", "clip", False),
    ("vllm", "anything", True), ("no_such_engine", "llama", True),
])
def test_loads_family(engine, family, loads):
    from skulk.shared.types.engines import loads_family

    assert loads_family(engine, family) is loads


def test_mlx_loads_every_family_on_one_rank():
    """Any model type mlx-lm loads runs whole on one rank (tests/worker/engines/test_mlx_features.py
    runs a tiny Gemma 3); only families with an adapter span ranks."""
    families = ENGINE_TRAITS["mlx"].families
    sharded = ENGINE_TRAITS["mlx"].sharded_families
    assert families is not None and sharded is not None and sharded <= families
    assert {"gemma3", "qwen3_moe", "gpt_oss", "olmo2"} <= families - sharded


# -- the table's invariants: facts that must hold together for every row --------------------


@pytest.mark.parametrize("engine", sorted(ENGINE_TRAITS))
def test_every_row_is_coherent(engine):
    """A row the rest of the code could misread is caught here, not at a node's load time."""
    traits = ENGINE_TRAITS[engine]
    assert traits.formats, "an engine loads some format"
    # Served or in-process, never both, never neither: the facts probe reads one of them.
    assert traits.served != bool(traits.modules)
    # Only a served engine runs several requests at once; its bounds hold together.
    if traits.slots is not None:
        assert traits.served
        assert 1 <= traits.slots.default <= traits.slots.maximum
    # Spanning facts only on engines that span.
    if not traits.multi_node:
        assert not traits.ranks_dial and not traits.pool_donors and traits.sharded_families == frozenset()
    else:
        assert traits.ranks_dial, "the ranks of a spanning instance reach each other"
    if traits.pipeline_features is not None:
        assert traits.pipeline_features <= traits.features
    # A served twin reads the same artifacts and decodes many at once.
    if traits.served_twin is not None:
        twin = ENGINE_TRAITS[traits.served_twin]
        assert twin.served and twin.slots is not None and twin.formats == traits.formats
    assert not traits.managed_build or traits.served, "only a served engine has a binary to build"
    if traits.apple_only:
        assert set(traits.vendor_computes) == {"apple"} and not traits.cpu_floor
    assert set(traits.vendor_computes) <= {"nvidia", "amd", "apple"}  # Intel is never inferred
    if traits.context_cap_tokens is not None:
        assert traits.context_cap_tokens > 0


def test_everything_that_reads_engine_facts_reads_this_table():
    """The other places that once held their own copy now derive from ENGINE_TRAITS."""
    from skulk.facts.derive import ENGINES as FACT_SPECS
    from skulk.master.backend_choice import SERVED_TWIN
    from skulk.master.ring_hosts import SPANNING_TRANSPORT_ENGINES
    from skulk.shared.slots import DEFAULT_SLOTS, MAX_SLOTS, PER_SLOT_KV_ENGINES, SLOT_SETTING_ENV
    from skulk.shared.types.engines import KNOWN_ENGINES, SERVED_ENGINES
    from skulk.shared.types.node_facts import ENGINE_BINARY_ENV, PROBED_MODULES
    from skulk.worker.runner.bootstrap import ENGINES as CONSTRUCTORS

    assert [spec.engine for spec in FACT_SPECS] == list(ENGINE_TRAITS)
    assert all(dict(spec.vendor_computes) == dict(ENGINE_TRAITS[spec.engine].vendor_computes)
               and spec.cpu_floor == ENGINE_TRAITS[spec.engine].cpu_floor for spec in FACT_SPECS)
    assert dict(SERVED_TWIN) == {"llama_cpp": "llama_server"}
    assert {"mlx", "llama_cpp"} == SPANNING_TRANSPORT_ENGINES
    assert set(SLOT_SETTING_ENV) == set(DEFAULT_SLOTS) == set(MAX_SLOTS) == SERVED_ENGINES == set(ENGINE_BINARY_ENV)
    assert {"llama_server"} == PER_SLOT_KV_ENGINES
    assert set(PROBED_MODULES) == {"llama_cpp", "mlx", "mlx_lm", "faster_whisper", "mlx_whisper", "piper"}
    # Every engine a worker can construct is one the table describes.
    assert set(CONSTRUCTORS) <= KNOWN_ENGINES


@pytest.mark.parametrize(("engine", "rank", "donor"), [
    ("llama_cpp", 0, False), ("llama_cpp", 1, True), ("llama_cpp", 3, True),
    ("mlx", 1, False), ("llama_server", 1, False), ("no_such_engine", 1, False),
])
def test_is_pool_donor(engine, rank, donor):
    from skulk.shared.types.engines import is_pool_donor

    assert is_pool_donor(engine, rank) is donor


@pytest.mark.parametrize(("engine", "cap"), [("vllm", 32768), ("llama_cpp", None), ("mlx", None), ("no_such", None)])
def test_context_cap(engine, cap):
    from skulk.shared.types.engines import context_cap

    assert context_cap(engine) == cap


def _seeing(**fields) -> TextGenerationParams:
    from skulk.shared.types.common import ChatMessage
    from skulk.shared.types.ids import ModelId
    from skulk.shared.types.media import IMAGE_MARKER, ImageInput

    picture = ImageInput.of(b"\x89PNG...", "image/png", 1, 1)
    message = ChatMessage(role="user", content=f"{IMAGE_MARKER} what is it", images=[picture])
    return TextGenerationParams(model_id=ModelId("a/b"), messages=[message], **fields)


@pytest.mark.parametrize("count_only", [False, True])
def test_images_are_a_feature_even_to_count(count_only):
    # An engine that cannot see cannot count an image's tokens either.
    assert required_features(_seeing(count_only=count_only)) == [(Feature.IMAGES, "messages")]
    assert required_features(_seeing(logprobs=True)) == [(Feature.LOGPROBS, "logprobs"), (Feature.IMAGES, "messages")]


@pytest.mark.parametrize(("engine", "pipelined", "sees"), [
    ("llama_server", False, True),
    ("llama_cpp", False, True),
    ("llama_cpp", True, False),  # a pool's driver has no mtmd path over its donors
    ("mlx", False, False),
    ("vllm", False, False),
])
def test_only_the_llama_cpp_engines_see_images(engine, pipelined, sees):
    missing = [feature for feature, _ in missing_features(engine, _seeing(), pipelined=pipelined)]
    assert missing == ([] if sees else [Feature.IMAGES])
