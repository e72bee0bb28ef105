"""Building a model card from what a repository (or a local directory) says about itself.

Model discovery (`GET /models/search`, `POST /models/add`) turns a Hugging Face repo or a
local path into a custom card. The facts come from two places: a safetensors model's
config.json (-> an MLX card) and a GGUF file's own metadata header (-> a llama.cpp card:
mlx-lm cannot load GGUF, so a GGUF repo never gets an MLX card). This module holds the pure
part: parsing a GGUF header from bytes, mapping either source onto a `ModelCard`, and the
helpers of the filename-shaped search fallback. It never does I/O; the routes fetch bytes.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from pydantic import ValidationError

from skulk.models.hub_files import RepoFile, is_gguf, quant_of
from skulk.shared.kv_shape import config_kv_shape, gguf_value_head_dim
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.engine_architectures import LLAMA_CPP_VERSION, MLX_LM_VERSION
from skulk.shared.types.engines import loads_family, on_vision_path

EXPERT_TENSOR_MARK = "_exps."
"""llama.cpp names stacked expert tensors `blk.N.ffn_{gate,up,down}_exps.weight`."""
MLX_EXPERT_TENSOR_MARKS = (".switch_mlp.", ".experts.")
"""mlx-lm stacks experts under `switch_mlp`; Hugging Face checkpoints keep `experts.N`
(a shared expert, `shared_expert(s).`, is computed for every token and does not match)."""
"""GGUF tensors holding every expert of a MoE layer (`blk.N.ffn_up_exps.weight`, ...): a
token computes through `expert_used_count` of `expert_count` of them."""

WINDOW_PATTERNS: Mapping[str, int] = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6}
"""Global/windowed interleave period of families whose configs may omit it."""

MLX_BACKENDS = ("mlx", "mlx-cpu", "mlx-metal")
MLX_PREFERENCE = ("mlx-metal", "mlx-cpu", "mlx")
GGUF_BACKENDS = ("llama_cpp", "llama_cpp-cuda", "llama_cpp-rocm", "llama_cpp-metal", "llama_cpp-vulkan", "llama_cpp-cpu",
                 "llama_server", "llama_server-cpu", "llama_server-cuda", "llama_server-vulkan", "llama_server-metal")
GGUF_PREFERENCE = ("llama_cpp-cuda", "llama_cpp-rocm", "llama_cpp-metal", "llama_cpp-vulkan", "llama_cpp-cpu", "llama_cpp")
"""The same engine lists the built-in cards use (resources/model_cards): a built card allows
llama-server too, so a node that has one serves the model with its slots (the preference
ranks only the in-process tags, so `skulk.master.backend_choice` puts each served twin
first)."""

GGUF_HEADER_LIMIT_BYTES = 32 * 1024 * 1024
"""Most bytes read to parse a GGUF header. The metadata sits before the tensors but holds
the whole tokenizer (a 150k-token vocabulary with merges is ~10 MB); a header that does not
fit is refused rather than read without bound."""


class CardBuildError(Exception):
    """The source cannot become a card: which source, and why (for a 4xx answer)."""

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(source, reason)

    def __str__(self) -> str:
        return f"{self.source}: {self.reason}"


class GgufTruncated(CardBuildError):
    """The bytes ended inside the header: read more (up to GGUF_HEADER_LIMIT_BYTES)."""


# ---------------------------------------------------------------------------------------
# GGUF header
# ---------------------------------------------------------------------------------------

_SCALARS: Mapping[int, str] = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
                               11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Reader:
    def __init__(self, data: bytes, source: str) -> None:
        self.data, self.pos, self.source = data, 0, source

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise GgufTruncated(self.source, f"the GGUF header continues past {len(self.data)} bytes")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.unpack("<Q")).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            element, count = self.unpack("<I"), self.unpack("<Q")
            # Only the length is kept: arrays are token lists and scores, megabytes of them.
            for _ in range(count):
                self.value(element)
            return count
        raise CardBuildError(self.source, f"unknown GGUF value type {kind}")


@dataclass(frozen=True)
class GgufHeader:
    """A GGUF file's header: its metadata (arrays replaced by their length) and the element
    count of each tensor it describes (the weights themselves follow the header)."""

    meta: Mapping[str, Any]
    tensor_elements: Mapping[str, int]


MAX_TENSOR_DIMS = 8
"""GGML_MAX_DIMS is 4; a header claiming more is corrupt."""


def parse_gguf_header(data: bytes, source: str = "gguf") -> GgufHeader:
    """The header of a GGUF file from its first bytes. Raises GgufTruncated when `data` ends
    inside it (metadata and tensor table)."""
    reader = _Reader(data, source)
    if reader.take(4) != b"GGUF":
        raise CardBuildError(source, "not a GGUF file (bad magic)")
    version = reader.unpack("<I")
    if version < 2:
        raise CardBuildError(source, f"GGUF version {version} is too old (need 2 or later)")
    tensor_count = reader.unpack("<Q")
    count = reader.unpack("<Q")
    meta: dict[str, Any] = {}
    for _ in range(count):
        key = reader.string()
        meta[key] = reader.value(reader.unpack("<I"))
    tensors: dict[str, int] = {}
    for _ in range(tensor_count):
        name = reader.string()
        dims = reader.unpack("<I")
        if dims > MAX_TENSOR_DIMS:
            raise CardBuildError(source, f"tensor {name!r} claims {dims} dimensions")
        tensors[name] = math.prod(reader.unpack("<Q") for _ in range(dims))
        reader.unpack("<I")  # ggml type
        reader.unpack("<Q")  # data offset
    return GgufHeader(meta=meta, tensor_elements=tensors)


def parse_gguf_metadata(data: bytes, source: str = "gguf") -> dict[str, Any]:
    """The key/value metadata of a GGUF file from its first bytes (see parse_gguf_header)."""
    return dict(parse_gguf_header(data, source).meta)


# ---------------------------------------------------------------------------------------
# Cards
# ---------------------------------------------------------------------------------------


def _family(source: str, architecture: object, engine: str, what: str) -> str:
    """The architecture when `engine` loads it: the engines' own tables decide
    (`skulk.shared.types.engine_architectures`, generated from them), never a list of ours."""
    if not isinstance(architecture, str) or not architecture:
        raise CardBuildError(source, f"the metadata names no {what}")
    if not loads_family(engine, architecture):
        if engine == "mlx":
            engine_name = f"mlx-lm {MLX_LM_VERSION}"
        else:
            engine_name = f"the llama.cpp of llama-cpp-python {LLAMA_CPP_VERSION}"
        raise CardBuildError(source, f"{what} {architecture!r} is not one {engine_name} can load")
    return architecture


HARMONY_MARK = "<|channel|>"
"""In a chat template: the model answers in harmony channels (gpt-oss)."""
THINK_TAGS = ("<think>", "</think>")
HARMONY_MODEL_TYPES = frozenset({"gpt-oss", "gpt_oss"})
"""The harmony family as llama.cpp and mlx-lm name it (an MLX card has no template to read)."""


SWITCH_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("enable_thinking", re.compile(r"\benable_thinking\b")),
    ("thinking", re.compile(r"{%-?\s*(?:if|elif)\s+(?:not\s+)?thinking\b")),
    ("reasoning_effort", re.compile(r"\breasoning_effort\b")),
)
"""Template variables that switch reasoning (`skulk.shared.reasoning_switches`), as a
template reads them."""

TOOL_MARKS: tuple[tuple[str, str], ...] = (
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_tag|>", "llama3_json"),
)
"""In a chat template: how the model writes tool calls (first match wins; harmony aside)."""


def _chat_format(family: str, template: object) -> dict:
    """How the model marks its reasoning and its tool calls, from its own chat template (the
    GGUF's, where the card builder can read one) or its family: harmony channels, `<think>`
    tags, the common tool-call shapes. A card that names a format gets the capability with
    it (the card's rule); a template that names none leaves the card's defaults."""
    text = template if isinstance(template, str) else ""
    harmony = HARMONY_MARK in text or family in HARMONY_MODEL_TYPES
    out: dict[str, Any] = {}
    capabilities = ["text"]
    reasoning: dict[str, Any] | None = None
    if harmony:
        reasoning = {"format": "harmony"}
    elif THINK_TAGS[0] in text and THINK_TAGS[1] in text:
        reasoning = {"format": "think_tags", "start_tag": THINK_TAGS[0], "end_tag": THINK_TAGS[1]}
    if reasoning is not None:
        capabilities.append("thinking")
        switches = [name for name, pattern in SWITCH_PATTERNS if pattern.search(text)]
        if family in HARMONY_MODEL_TYPES and "reasoning_effort" not in switches and not text:
            switches.append("reasoning_effort")  # a gpt-oss card built without its template
        if switches:
            reasoning["switches"] = switches
        out["reasoning"] = reasoning
    tools = "harmony" if harmony else next((fmt for mark, fmt in TOOL_MARKS if mark in text), None)
    if tools is not None:
        out["tooling"] = {"tool_call_format": tools}
        capabilities.append("tools")
    if len(capabilities) > 1:
        out["capabilities"] = capabilities
    return out


def _experts(source: str, data: Mapping[str, Any], count_keys: Sequence[str], used_keys: Sequence[str]) -> dict:
    count = next((data[k] for k in count_keys if isinstance(data.get(k), int) and data[k] > 1), None)
    if count is None:
        return {}
    used = _int(source, data, *used_keys)
    return {"num_experts": count, "num_experts_used": used}


def _parameters(tensors: Mapping[str, int] | None, experts: Mapping[str, int],
                marks: Sequence[str] = (EXPERT_TENSOR_MARK,)) -> dict:
    """Total parameters from the tensor table, and active ones: every expert tensor (its
    name holds one of `marks`) counts only its used share (shared experts and everything
    else are always computed)."""
    if not tensors:
        return {}
    total = sum(tensors.values())
    if not experts:
        return {"total_parameters": total, "active_parameters": total}
    expert = sum(n for name, n in tensors.items() if any(mark in name for mark in marks))
    active = total - expert + expert * experts["num_experts_used"] // experts["num_experts"]
    return {"total_parameters": total, "active_parameters": active}


def _validated(source: str, data: Mapping[str, Any]) -> ModelCard:
    try:
        return ModelCard.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise CardBuildError(source, f"the metadata does not make a valid card: {first['msg']}") from None


def _int(source: str, data: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    if default is not None:
        return default
    raise CardBuildError(source, f"the metadata has no {' / '.join(keys)}")


def _quantization_from_config(config: Mapping[str, Any]) -> str:
    quant = config.get("quantization") or config.get("quantization_config")
    if isinstance(quant, Mapping) and isinstance(quant.get("bits"), int):
        return f"{quant['bits']}bit"
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
    return {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(dtype, dtype or "unknown")


def _identity(model_id: str, name: str | None, source: str, revision: str | None, local_path: str | None) -> dict:
    return {
        "model_id": model_id,
        "name": name or model_id.split("/", 1)[-1],
        "source": source,
        "source_revision": revision,
        "local_path": local_path,
        "tasks": ["TextGeneration"],
        "capabilities": ["text"],
    }


def card_from_config(
    model_id: str,
    config: Mapping[str, Any],
    storage_size_bytes: int,
    *,
    revision: str | None = None,
    local_path: str | None = None,
    name: str | None = None,
    chat_template: str | None = None,
    tensor_elements: Mapping[str, int] | None = None,
) -> ModelCard:
    """An MLX card from a safetensors model's config.json and its chat template (read by
    `skulk.models.template_files`; None: the family decides). Multimodal configs keep the
    language model's shape in `text_config`, which wins over the top level.
    `tensor_elements` (parameters per tensor over every weight file, see
    `skulk.models.safetensors_header`) gives the parameter counts."""
    text = config.get("text_config")
    merged = {**config, **text} if isinstance(text, Mapping) else dict(config)
    family = _family(model_id, config.get("model_type") or merged.get("model_type"), "mlx", "model_type")
    heads = _int(model_id, merged, "num_attention_heads")
    hidden = _int(model_id, merged, "hidden_size")
    window = merged.get("sliding_window")
    if merged.get("use_sliding_window") is False or not isinstance(window, int) or window <= 0:
        window = None
    pattern = merged.get("sliding_window_pattern") or (WINDOW_PATTERNS.get(family) if window else None)
    kv = config_kv_shape(merged, heads, hidden)
    experts = _experts(model_id, merged, ("num_experts", "num_local_experts", "n_routed_experts"),
                       ("num_experts_per_tok", "num_experts_per_token", "moe_topk"))
    return _validated(model_id, {
        **_identity(model_id, name, "local-path" if local_path else "huggingface", revision, local_path),
        "family": family,
        "quantization": _quantization_from_config(config),
        "storage_size_bytes": max(1, storage_size_bytes),
        "num_layers": _int(model_id, merged, "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv.kv_heads,
        "head_dim": kv.head_dim,
        "value_head_dim": kv.value_head_dim,
        **experts,
        **_parameters(tensor_elements, experts, MLX_EXPERT_TENSOR_MARKS),
        "vocab_size": _int(model_id, merged, "vocab_size"),
        "context_length": _int(model_id, merged, "max_position_embeddings"),
        "sliding_window": window,
        "sliding_window_pattern": pattern if window else None,
        "placement": {"compatible_backends": list(MLX_BACKENDS), "backend_preference": list(MLX_PREFERENCE)},
        **_mlx_vision(_chat_format(family, chat_template), config, family),
    })


def _mlx_vision(fields: dict[str, Any], config: Mapping[str, Any], family: str) -> dict[str, Any]:
    """`fields` with the capability `vision` when the config has a vision tower that MLX's
    vision path runs (mlx-vlm, `on_vision_path`); a tower of another family is not
    advertised: that card runs on the text path, which refuses images by name."""
    if not isinstance(config.get("vision_config"), Mapping) or not on_vision_path("mlx", family, True):
        return fields
    return {**fields, "capabilities": [*fields.get("capabilities", ["text"]), "vision"]}


def card_from_gguf(
    model_id: str,
    meta: Mapping[str, Any],
    gguf_file: str,
    storage_size_bytes: int,
    *,
    revision: str | None = None,
    local_path: str | None = None,
    name: str | None = None,
    tensor_elements: Mapping[str, int] | None = None,
    projector_file: str | None = None,
    projector_size_bytes: int | None = None,
) -> ModelCard:
    """A llama.cpp card from a GGUF file's metadata; `gguf_file` is pinned on the card (the
    first shard of a split file). `tensor_elements` (the header's tensor table) gives the
    parameter counts; a split file's first shard holds only some tensors, so none then.
    `projector_file`: the repo's multimodal projector (an mmproj GGUF, `vision_projector`):
    the card then sees images, with the projector as its vision companion from the same repo,
    and `projector_size_bytes` (its size in the listing, required with it) as the bytes
    placement admits for it."""
    arch = meta.get("general.architecture")
    family = _family(model_id, arch, "llama_cpp", "architecture")
    prefixed = {k.removeprefix(f"{arch}."): v for k, v in meta.items()}
    heads = _int(model_id, prefixed, "attention.head_count")
    hidden = _int(model_id, prefixed, "embedding_length")
    window = prefixed.get("attention.sliding_window")
    window = window if isinstance(window, int) and window > 0 else None
    key_length = _int(model_id, prefixed, "attention.key_length", default=hidden // heads)
    experts = _experts(model_id, prefixed, ("expert_count",), ("expert_used_count",))
    split = meta.get("split.count")
    whole = tensor_elements if not (isinstance(split, int) and split > 1) else None
    return _validated(model_id, {
        **_identity(model_id, name, "local-path" if local_path else "huggingface", revision, local_path),
        "family": family,
        "gguf_file": gguf_file,
        "quantization": quant_of(gguf_file) or "gguf",
        "storage_size_bytes": max(1, storage_size_bytes),
        "num_layers": _int(model_id, prefixed, "block_count"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": _int(model_id, prefixed, "attention.head_count_kv", default=heads),
        "head_dim": key_length,
        "value_head_dim": gguf_value_head_dim(prefixed, key_length),
        **experts,
        **_parameters(whole, experts),
        "vocab_size": _int(model_id, prefixed, "vocab_size", "tokenizer.ggml.tokens"),
        "context_length": _int(model_id, prefixed, "context_length"),
        "sliding_window": window,
        "sliding_window_pattern": WINDOW_PATTERNS.get(family) if window else None,
        "placement": {"compatible_backends": list(GGUF_BACKENDS), "backend_preference": list(GGUF_PREFERENCE)},
        **_with_vision(_chat_format(family, meta.get("tokenizer.chat_template")), model_id, projector_file,
                       projector_size_bytes),
    })


def _with_vision(fields: dict[str, Any], repo: str, projector_file: str | None,
                 projector_size_bytes: int | None) -> dict[str, Any]:
    """`fields` with the capability `vision` and the projector companion (and its size), when
    there is one. A projector of unknown size is refused: placement could not admit it."""
    if projector_file is None:
        return fields
    if projector_size_bytes is None or projector_size_bytes <= 0:
        raise CardBuildError(repo, f"the repository listing does not state the size of its projector {projector_file}, "
                             "so placement could not admit it; write a card file with vision_weights_size_bytes")
    return {**fields, "capabilities": [*fields.get("capabilities", ["text"]), "vision"],
            "vision_weights_repo": repo, "vision_weights_file": projector_file,
            "vision_weights_size_bytes": projector_size_bytes}


MMPROJ_PREFERENCE: tuple[str, ...] = ("f16", "bf16", "f32", "q8_0")
"""Which projector of several a card takes: the projector is small next to the model, so full
precision first (a quantized projector costs image understanding for little memory)."""


def vision_projector(files: Sequence[RepoFile]) -> str | None:
    """The repo's multimodal projector (an `mmproj` GGUF) a card of its model takes, or None.
    Several (one per precision): the first of MMPROJ_PREFERENCE in the name, else the first by name."""
    projectors = sorted(f.path for f in files if f.path.lower().endswith(".gguf")
                        and "mmproj" in PurePosixPath(f.path).name.lower())
    for precision in MMPROJ_PREFERENCE:
        found = next((p for p in projectors if precision in PurePosixPath(p).name.lower()), None)
        if found is not None:
            return found
    return projectors[0] if projectors else None


_SLUG_RE = re.compile(r"[^A-Za-z0-9._-]+")


def local_model_id(name: str) -> str:
    """'local/<name>' for a local path's file or directory name, as a valid card id."""
    slug = _SLUG_RE.sub("-", name).strip("-._")
    while "--" in slug or ".." in slug:
        slug = slug.replace("--", "-").replace("..", ".")
    return f"local/{slug or 'model'}"


# ---------------------------------------------------------------------------------------
# Search fallback for filename-shaped queries
# ---------------------------------------------------------------------------------------

MAX_PREFIX_STEPS = 4
"""Broadening steps of the filename fallback (each is one hub search)."""
MAX_INSPECTED_REPOS = 12
"""Repositories whose file listing the fallback reads, in all: bounds its hub requests."""


def is_filename_query(query: str) -> bool:
    return is_gguf(query.strip())


def broadening_prefixes(query: str, steps: int = MAX_PREFIX_STEPS) -> tuple[str, ...]:
    """Search terms for a GGUF file name, narrowest first: the name without '.gguf' and
    shard suffix, then with trailing '-'/'.'/'_' separated parts dropped one at a time
    ('Model-7B-Q4_K_M.gguf' -> 'Model-7B-Q4_K_M', 'Model-7B-Q4_K', ...), at most `steps`,
    never shorter than 3 characters (a search for 'a' matches the whole hub)."""
    name = PurePosixPath(query.strip()).name
    stem = re.sub(r"-\d{5}-of-\d{5}\.gguf$", "", name, flags=re.IGNORECASE)
    stem = re.sub(r"\.gguf$", "", stem, flags=re.IGNORECASE)
    out: list[str] = []
    current = stem
    while current and len(out) < steps:
        if len(current) >= 3 and current not in out:
            out.append(current)
        cut = max(current.rfind("-"), current.rfind("."), current.rfind("_"))
        if cut <= 0:
            break
        current = current[:cut]
    return tuple(out)


def match_basename(files: Sequence[RepoFile], query: str) -> str | None:
    """The repo-relative path whose basename is exactly the queried file name (shortest
    path first when several folders hold it)."""
    wanted = PurePosixPath(query.strip()).name
    hits = sorted((f.path for f in files if PurePosixPath(f.path).name == wanted), key=lambda p: (p.count("/"), p))
    return hits[0] if hits else None


__all__ = [
    "EXPERT_TENSOR_MARK",
    "GGUF_HEADER_LIMIT_BYTES",
    "MAX_INSPECTED_REPOS",
    "MAX_PREFIX_STEPS",
    "MLX_EXPERT_TENSOR_MARKS",
    "CardBuildError",
    "GgufHeader",
    "GgufTruncated",
    "broadening_prefixes",
    "card_from_config",
    "card_from_gguf",
    "is_filename_query",
    "local_model_id",
    "match_basename",
    "parse_gguf_header",
    "parse_gguf_metadata",
    "vision_projector",
]
