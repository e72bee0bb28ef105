"""The project's generated models, and resolving a card to the file an engine loads.

No hub is reachable in tests and demos, so the project makes its own model: a small
Llama-architecture network with random weights and a BPE tokenizer trained on the bundled
`resources/tiny_corpus.txt`, written twice from the same arrays:

- `hf/`: config.json, tokenizer.json, tokenizer_config.json (with a Llama-3 chat template),
  special_tokens_map.json, generation_config.json and model.safetensors, for `mlx_lm.load`;
- `model.gguf`: the same weights and tokenizer for `llama_cpp.Llama`;
- `hf/` as a LLaVA model for mlx-vlm, for local/tiny-vlm (`write_mlx_vlm`): the same
  language model under `language_model.`, a tiny CLIP vision tower and LLaVA's two-layer
  projector with `TINY_VISION_SPEC`'s shapes, the tokenizer plus an `<image>` token, and
  CLIP preprocessor / LLaVA processor configs. No GGUF: llama.cpp reads its projector as
  `mmproj.gguf` (local/tiny-vlm-gguf);
- `hf/` as a Gemma 3 VLM for mlx-vlm, for local/tiny-gemma3-vlm (`write_mlx_vlm_gemma3`):
  the same shapes as a Gemma 3 language model (its extra norms), a tiny SigLIP tower and
  Gemma 3's projector, the tokenizer plus Gemma 3's image tokens, and Gemma 3's processor
  configs;
- `hf/` as a Qwen2.5-VL model for mlx-vlm, for local/tiny-qwen2.5-vl
  (`write_mlx_vlm_qwen2_5_vl`): a Qwen2 language model of the same shapes with M-RoPE, a
  tiny Qwen2.5-VL vision tower and patch merger, the tokenizer plus Qwen's vision tokens, and
  the Qwen2-VL image processor config;
- `mmproj.gguf`, for a vision model only (`TinyVisionSpec`): a LLaVA-style multimodal
  projector (a tiny CLIP ViT and a two-layer `mlp` projector into the LM's embedding size)
  with random weights, which llama.cpp's `mtmd` loads beside `model.gguf` (llama-server's
  `--mmproj`). Each image becomes `(image_size / patch_size) ** 2` embeddings in the prompt.

Both engines decode the same greedy tokens from it (tests/models/test_tiny_models.py holds
them to that). Generation is deterministic: the same spec gives the same bytes on every run
and machine, because weights come from counter-based PCG64 streams turned into floats by
exact integer arithmetic (not numpy's distribution samplers, whose streams may change
between numpy releases), and every file is written in a fixed order with no timestamps.

The tokenizer's alphabet is ASCII only: every token decodes to valid UTF-8 on its own, so a
random model's stream arrives token by token rather than in bursts of partial characters.
The price: other characters (non-ASCII, control codes) have no token and both engines
drop them on input.

`ensure_generated` produces a local-generated card's files; which source a card's files come
from is decided in one place, `skulk.artifacts.plan.route_for`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from skulk.datadir.file_lock import exclusive_file_lock
from skulk.models.artifact_errors import ArtifactUnavailable
from skulk.models.cards import builtin_cards_dir
from skulk.models.seeded_noise import bytes_to_unicode as _bytes_to_unicode
from skulk.models.seeded_noise import uniform as _uniform
from skulk.models.tiny_speech import SPEECH_GENERATORS, GeneratedSpeechModel
from skulk.shared.types.cards import ModelCard

logger = logging.getLogger(__name__)

GENERATOR_VERSION = 1
"""Bump when the generator's output changes for an unchanged spec (init scheme, file set,
tokenizer settings): it is part of the spec hash, so existing model dirs are regenerated."""

CORPUS_FILE_NAME = "tiny_corpus.txt"
HF_DIR_NAME = "hf"
GGUF_FILE_NAME = "model.gguf"
PROJECTOR_FILE_NAME = "mmproj.gguf"
"""A generated vision model's projector, next to its `model.gguf`: the local-generated
counterpart of a hub card's `vision_weights_file` companion (`skulk.models.companions`)."""
MARKER_FILE_NAME = "skulk-generated.json"
"""Written last into a completed model directory; carries the spec hash it was made for."""

GENERATION_LOCK_TIMEOUT_S = 600.0
"""Longest a caller waits for another process generating the same model. Generating the
tiny model takes about a second; the benchmark model, written through the CLI, never takes
this lock. A holder that stalls this long is stuck, and the caller fails loudly."""
LOCK_POLL_INTERVAL_S = 0.05

Dtype = Literal["float32", "float16"]

# ---------------------------------------------------------------------------------------
# Tokenizer: special tokens and chat template (Llama 3 instruct style).
# ---------------------------------------------------------------------------------------

BOS_TOKEN = "<|begin_of_text|>"
END_OF_TEXT_TOKEN = "<|end_of_text|>"
START_HEADER_TOKEN = "<|start_header_id|>"
END_HEADER_TOKEN = "<|end_header_id|>"
EOT_TOKEN = "<|eot_id|>"
EOS_TOKEN = EOT_TOKEN
"""The tokenizer's eos: a chat turn ends with <|eot_id|>, as in Llama 3 instruct models.
Generation stops on either <|eot_id|> or <|end_of_text|> (config.json lists both; llama.cpp
recognises both by name as end-of-generation tokens)."""

ALPHABET_BYTES: tuple[int, ...] = (0x09, 0x0A, 0x0D, *range(0x20, 0x7F))
"""The tokenizer's base alphabet: printable ASCII, tab, newline and carriage return. Every
token is a string of these, so each decodes to valid UTF-8 alone, and a random model never
emits NULs or terminal escapes. Any other character has no token: both engines drop it."""

SPECIAL_TOKENS: tuple[str, ...] = (BOS_TOKEN, END_OF_TEXT_TOKEN, START_HEADER_TOKEN, END_HEADER_TOKEN, EOT_TOKEN)
"""Ids 0..4, in this order; the trained BPE vocabulary follows them. The model never
generates them: their lm_head rows are zero, so their logit is 0 while the best ordinary
token's is ~+20. A random model would otherwise end turns or emit <|begin_of_text|> at
arbitrary points; this one always runs to max_tokens (or a stop string), which tests count
on. They are still recognised in input (chat templates) and stop generation if forced."""

CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
"""Meta's Llama 3 instruct template, character for character: llama-cpp-python recognises
it as its built-in 'llama-3' format and llama.cpp's own template detection does too."""

# ---------------------------------------------------------------------------------------
# Weight initialisation: uniform noise; a linear layer's std is its gain / sqrt(fan_in).
# ---------------------------------------------------------------------------------------

EMBED_STD = 1.0
"""Token embeddings at unit scale (only ratios matter: every block reads an RMS-normalised
residual)."""
HIDDEN_GAIN = 1.0
"""Gain of q/k/v/gate/up, whose inputs are RMS-normalised: unit-variance activations."""
RESIDUAL_GAIN = 0.5
"""Gain of o_proj and down_proj. Measured on TINY_SPEC: at 1.0 errors grow through the
layers (greedy parity margin halves) and some prompts fall into one-token loops; at 0.35 the
embedding dominates and loops again; 0.5 gives varied output and the smallest disagreement."""
LOGIT_STD = 8.0
"""Standard deviation of the output logits (lm_head gain over the unit-RMS final norm):
decisive distributions, so sampling at ordinary temperatures stays close to greedy. What
keeps the engines' greedy tokens equal is the ratio of their numerical disagreement to the
gap between the top two logits, which this scale does not change: f32 weights, f32 compute
and RESIDUAL_GAIN keep that ratio near 1e-6 (see tests/models/test_tiny_models.py)."""


@dataclass(frozen=True)
class TinySpec:
    """Shape and numerics of a generated Llama model. Everything here feeds the spec hash."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rms_norm_eps: float
    seed: int
    dtype: Dtype

    def __post_init__(self) -> None:
        for name in (
            "num_layers",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "context_length",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"TinySpec.{name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("TinySpec.num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError("TinySpec.head_dim must be even (rotary embeddings rotate pairs)")
        if self.vocab_size <= len(SPECIAL_TOKENS) + len(ALPHABET_BYTES):
            raise ValueError(
                f"TinySpec.vocab_size must exceed {len(SPECIAL_TOKENS) + len(ALPHABET_BYTES)} (specials + alphabet)"
            )
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"TinySpec.dtype must be 'float32' or 'float16', got {self.dtype!r}")

    @property
    def parameter_count(self) -> int:
        attention = self.hidden_size * self.head_dim * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        per_layer = attention + mlp + 2 * self.hidden_size
        return self.num_layers * per_layer + 2 * self.vocab_size * self.hidden_size + self.hidden_size


TINY_SPEC = TinySpec(
    num_layers=6,
    hidden_size=128,
    intermediate_size=384,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=512,
    context_length=2048,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    seed=0,
    dtype="float32",
)
"""The shape of the built-in cards local/tiny-llama and local/tiny-llama-gguf (1.3 M
parameters, ~5 MB per format). float32 in both formats: MLX on CPU and llama.cpp then both
compute in f32 and agree token for token."""

BENCH_SPEC = replace(
    TINY_SPEC,
    num_layers=8,
    hidden_size=1024,
    intermediate_size=2816,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=64,
)
"""The benchmark model: the same architecture (Llama, GQA 2:1, same tokenizer and init) at
95 M parameters, ~380 MB of f32 weights per format, so each decoded token streams enough
memory that timings measure the engines, not per-token overhead. f32 rather than f16: MLX's
CPU backend has no fast f16 path (measured on a 2-core box: MLX 2.3 tok/s at f16 vs 3.3 at
f32; llama.cpp 4.8 tok/s at f32), and f32 keeps the two engines' greedy tokens equal here
too. Write it with `python -m skulk.models.tiny_models OUT_DIR --bench` (about 10 s)."""

TINY_DRAFT_SPEC = replace(
    TINY_SPEC,
    num_layers=1,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    seed=1,
)
"""A draft model for the tiny Llama (draft-model speculation's tests and benchmark): the same
tokenizer (the vocabulary size and corpus decide it), one layer at half the width, its own
random weights, so it agrees with the target only as often as chance has it."""


@dataclass(frozen=True)
class TinyVisionSpec:
    """Shape of a generated multimodal projector (llama.cpp's `clip` arch, projector type
    `mlp`: a CLIP ViT with a class token and pre-norm, then Linear-GELU-Linear into the LM).
    Everything here feeds the spec hash."""

    image_size: int
    patch_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    projection_gain: float
    seed: int

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError("TinyVisionSpec.image_size must be a multiple of patch_size")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("TinyVisionSpec.hidden_size must be a multiple of num_attention_heads")

    @property
    def image_tokens(self) -> int:
        """Embeddings (prompt positions) one image takes: one per patch; the class token is
        dropped before the projector, as in LLaVA."""
        return (self.image_size // self.patch_size) ** 2


TINY_VISION_SPEC = TinyVisionSpec(
    image_size=32,
    patch_size=8,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_attention_heads=2,
    projection_gain=4.0,
    seed=0,
)
"""The projector of local/tiny-vlm-gguf: 16 tokens per image, ~0.4 MB. llama.cpp resizes any
image to 32x32 first, so a test's images should differ in colour, not detail.
`projection_gain` scales the projector's output layer (its std is gain / sqrt(fan_in)):
at 1.0 image embeddings are much smaller than the unit-scale token embeddings and two very
different images (black, white) steer greedy decoding apart only after several tokens; at
4.0 they diverge within the first few."""

CLIP_PROJECTOR_TYPE = "mlp"
"""llama.cpp's `PROJECTOR_TYPE_MLP` (LLaVA 1.5's projector), the simplest one it loads."""
CLIP_NORM_EPS = 1e-5
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.5, 0.5, 0.5)
"""Pixel normalisation: [0, 1] to [-1, 1], so black and white images are far apart."""


@dataclass(frozen=True)
class TinyArtifacts:
    """What `generate_tiny_model` wrote."""

    hf_dir: Path
    gguf_path: Path
    hf_size_bytes: int
    gguf_size_bytes: int
    spec_hash: str
    projector_path: Path | None = None


# ---------------------------------------------------------------------------------------
# Corpus and spec identity
# ---------------------------------------------------------------------------------------


def corpus_path() -> Path:
    """The bundled tokenizer corpus (beside the built-in cards, in a checkout or a wheel)."""
    return builtin_cards_dir().parent / CORPUS_FILE_NAME


def _read_corpus() -> str:
    data = corpus_path().read_bytes()
    strays = sorted(set(data) - set(ALPHABET_BYTES))
    if strays:
        raise ValueError(f"{corpus_path()} holds bytes outside the tokenizer's alphabet: {strays[:10]}")
    return data.decode("ascii")


def spec_hash(spec: TinySpec, vision: TinyVisionSpec | None = None) -> str:
    """Identity of a generated model: the spec (and projector spec), the generator version
    and the corpus. A model directory whose marker carries another hash is stale and is
    regenerated."""
    identity = {
        "generator_version": GENERATOR_VERSION,
        "spec": asdict(spec),
        **({"vision": asdict(vision)} if vision is not None else {}),
        "corpus_sha256": hashlib.sha256(corpus_path().read_bytes()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------


def train_tokenizer(spec: TinySpec):  # -> tokenizers.Tokenizer (imported lazily)
    """A byte-level BPE tokenizer with exactly spec.vocab_size tokens: the special tokens,
    the alphabet (ALPHABET_BYTES), then merges learned from the corpus. Deterministic: the
    tests compare the files written by two processes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    byte_chars = _bytes_to_unicode()
    tokenizer = Tokenizer(models.BPE())
    # GPT-2's split regex, the same one llama.cpp applies for pre-tokenizer type 'gpt-2'.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=0,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=[byte_chars[b] for b in ALPHABET_BYTES],
        limit_alphabet=len(ALPHABET_BYTES),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_read_corpus()], trainer)
    if tokenizer.get_vocab_size() != spec.vocab_size:
        raise ValueError(
            f"the corpus yields {tokenizer.get_vocab_size()} tokens, not vocab_size {spec.vocab_size}: "
            f"lower vocab_size or extend {corpus_path()}"
        )
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN}:0 $A:0",
                pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
                special_tokens=[(BOS_TOKEN, bos_id)],
            ),
        ]
    )
    return tokenizer


# ---------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------


def _hf_weights(spec: TinySpec, silent_token_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """HF Llama tensors (out_features, in_features), float32, in a fixed order. The
    lm_head rows of `silent_token_ids` are zero (see SPECIAL_TOKENS)."""
    h, hd, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    q_out, kv_out = spec.num_attention_heads * hd, spec.num_key_value_heads * hd
    weights: dict[str, np.ndarray] = {}

    def linear(name: str, out_features: int, in_features: int, gain: float) -> None:
        weights[name] = _uniform(spec.seed, name, (out_features, in_features), gain / math.sqrt(in_features))

    embed = "model.embed_tokens.weight"
    weights[embed] = _uniform(spec.seed, embed, (spec.vocab_size, h), EMBED_STD)
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        weights[f"{p}.input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        linear(f"{p}.self_attn.q_proj.weight", q_out, h, HIDDEN_GAIN)
        linear(f"{p}.self_attn.k_proj.weight", kv_out, h, HIDDEN_GAIN)
        linear(f"{p}.self_attn.v_proj.weight", kv_out, h, HIDDEN_GAIN)
        linear(f"{p}.self_attn.o_proj.weight", h, q_out, RESIDUAL_GAIN)
        weights[f"{p}.post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
        linear(f"{p}.mlp.gate_proj.weight", inter, h, HIDDEN_GAIN)
        linear(f"{p}.mlp.up_proj.weight", inter, h, HIDDEN_GAIN)
        linear(f"{p}.mlp.down_proj.weight", h, inter, RESIDUAL_GAIN)
    weights["model.norm.weight"] = np.ones(h, dtype=np.float32)
    linear("lm_head.weight", spec.vocab_size, h, LOGIT_STD)
    weights["lm_head.weight"][list(silent_token_ids)] = 0.0
    return weights


_GGUF_LAYER_NAMES: Mapping[str, str] = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GGUF_GLOBAL_NAMES: Mapping[str, str] = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _gguf_name(hf_name: str) -> str:
    if hf_name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[hf_name]
    _, _, index, rest = hf_name.split(".", 3)  # model.layers.<i>.<module>.weight
    return f"blk.{index}.{_GGUF_LAYER_NAMES[rest.removesuffix('.weight')]}.weight"


def _rope_pairs_adjacent(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder a q/k projection's output rows per head from HF's rotate-half layout (MLX's
    non-traditional RoPE pairs dim i with i + d/2) to the interleaved layout llama.cpp's
    llama arch rotates (dims 2i and 2i + 1). Same permutation as llama.cpp's converter."""
    out_features = weight.shape[0]
    return (
        weight.reshape(n_heads, 2, out_features // n_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


# ---------------------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------------------


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _write_hf(hf_dir: Path, spec: TinySpec, tokenizer, weights: Mapping[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    hf_dir.mkdir(parents=True)
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    eos_ids = [ids[END_OF_TEXT_TOKEN], ids[EOT_TOKEN]]
    _write_json(
        hf_dir / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.num_layers,
            "num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.num_key_value_heads,
            "head_dim": spec.head_dim,
            "vocab_size": spec.vocab_size,
            "max_position_embeddings": spec.context_length,
            "rope_theta": spec.rope_theta,
            "rope_scaling": None,
            "rms_norm_eps": spec.rms_norm_eps,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "bos_token_id": ids[BOS_TOKEN],
            "eos_token_id": eos_ids,
            "torch_dtype": spec.dtype,
        },
    )
    (hf_dir / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    _write_json(
        hf_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "add_bos_token": True,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": spec.context_length,
            "model_input_names": ["input_ids", "attention_mask"],
            "added_tokens_decoder": {
                str(ids[token]): {
                    "content": token,
                    "lstrip": False,
                    "normalized": False,
                    "rstrip": False,
                    "single_word": False,
                    "special": True,
                }
                for token in SPECIAL_TOKENS
            },
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(hf_dir / "special_tokens_map.json", {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN})
    _write_json(
        hf_dir / "generation_config.json",
        {"bos_token_id": ids[BOS_TOKEN], "eos_token_id": eos_ids, "do_sample": False},
    )
    dtype = np.dtype(spec.dtype)
    save_file(
        {name: np.ascontiguousarray(w.astype(dtype)) for name, w in weights.items()},
        str(hf_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    # safetensors writes through a private temp file (mode 0600); nodes sharing a models
    # dir may run as other users, and every other file here is created 0644 (umask aside).
    os.chmod(hf_dir / "model.safetensors", 0o644)


def _write_gguf(path: Path, spec: TinySpec, tokenizer, weights: Mapping[str, np.ndarray]) -> None:
    import gguf

    vocab = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
    if [i for _, i in vocab] != list(range(spec.vocab_size)):
        raise RuntimeError("tokenizer ids are not contiguous")
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("Skulk tiny llama (generated)")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if spec.dtype == "float32" else gguf.LlamaFileType.MOSTLY_F16)
    writer.add_vocab_size(spec.vocab_size)
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.hidden_size)
    writer.add_block_count(spec.num_layers)
    writer.add_feed_forward_length(spec.intermediate_size)
    writer.add_head_count(spec.num_attention_heads)
    writer.add_head_count_kv(spec.num_key_value_heads)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(spec.rope_theta)
    writer.add_layer_norm_rms_eps(spec.rms_norm_eps)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # the GPT-2 split regex, as the ByteLevel pre-tokenizer uses
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types(
        [gguf.TokenType.CONTROL if token in SPECIAL_TOKENS else gguf.TokenType.NORMAL for token, _ in vocab]
    )
    writer.add_token_merges([f"{left} {right}" for left, right in merges])
    writer.add_bos_token_id(ids[BOS_TOKEN])
    writer.add_eos_token_id(ids[EOS_TOKEN])
    writer.add_eot_token_id(ids[EOT_TOKEN])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    dtype = np.dtype(spec.dtype)
    for name, weight in weights.items():
        if name.endswith("q_proj.weight"):
            weight = _rope_pairs_adjacent(weight, spec.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            weight = _rope_pairs_adjacent(weight, spec.num_key_value_heads)
        # Norm vectors stay f32 in an f16 file, as llama.cpp's converter writes them.
        stored = weight if weight.ndim == 1 else weight.astype(dtype)
        writer.add_tensor(_gguf_name(name), np.ascontiguousarray(stored))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tower_builders(vision: TinyVisionSpec) -> tuple[
        dict[str, np.ndarray], Callable[[str, tuple[int, ...], float], None],
        Callable[..., None], Callable[[str], None]]:
    """The tensors of a tiny vision tower and its three initialisers (seeded noise, a linear
    layer with a zero bias, a unit layer norm), shared by the GGUF and HF namings."""
    weights: dict[str, np.ndarray] = {}
    h = vision.hidden_size

    def noise(name: str, shape: tuple[int, ...], std: float) -> None:
        weights[name] = _uniform(vision.seed, name, shape, std)

    def linear(name: str, out_features: int, in_features: int, gain: float = HIDDEN_GAIN) -> None:
        noise(f"{name}.weight", (out_features, in_features), gain / math.sqrt(in_features))
        weights[f"{name}.bias"] = np.zeros(out_features, dtype=np.float32)

    def norm(name: str) -> None:
        weights[f"{name}.weight"] = np.ones(h, dtype=np.float32)
        weights[f"{name}.bias"] = np.zeros(h, dtype=np.float32)

    return weights, noise, linear, norm


def _clip_weights(vision: TinyVisionSpec, lm_hidden_size: int) -> dict[str, np.ndarray]:
    """GGUF `clip` tensors (numpy shape = ggml's ne reversed), float32, in a fixed order."""
    h, ff, p = vision.hidden_size, vision.intermediate_size, vision.patch_size
    weights, noise, linear, norm = _tower_builders(vision)

    noise("v.class_embd", (h,), EMBED_STD)
    noise("v.patch_embd.weight", (h, 3, p, p), HIDDEN_GAIN / math.sqrt(3 * p * p))
    noise("v.position_embd.weight", (vision.image_tokens + 1, h), EMBED_STD)
    norm("v.pre_ln")
    for i in range(vision.num_layers):
        b = f"v.blk.{i}"
        norm(f"{b}.ln1")
        for name in ("attn_q", "attn_k", "attn_v"):
            linear(f"{b}.{name}", h, h)
        linear(f"{b}.attn_out", h, h, RESIDUAL_GAIN)
        norm(f"{b}.ln2")
        linear(f"{b}.ffn_up", ff, h)
        linear(f"{b}.ffn_down", h, ff, RESIDUAL_GAIN)
    linear("mm.0", lm_hidden_size, h)
    linear("mm.2", lm_hidden_size, lm_hidden_size, vision.projection_gain)
    return weights


def _write_mmproj(path: Path, vision: TinyVisionSpec, lm_hidden_size: int) -> None:
    """The projector GGUF llama.cpp's `mtmd` loads (`--mmproj`): arch `clip`, a vision
    encoder, projector type `mlp` (LLaVA's), output dim = the LM's embedding size."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch="clip")
    writer.add_name("Skulk tiny vision projector (generated)")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type(CLIP_PROJECTOR_TYPE)
    writer.add_bool(gguf.Keys.Clip.HAS_LLAVA_PROJECTOR, True)
    writer.add_vision_image_size(vision.image_size)
    writer.add_vision_patch_size(vision.patch_size)
    writer.add_vision_embedding_length(vision.hidden_size)
    writer.add_vision_feed_forward_length(vision.intermediate_size)
    writer.add_vision_projection_dim(lm_hidden_size)
    writer.add_vision_block_count(vision.num_layers)
    writer.add_vision_head_count(vision.num_attention_heads)
    writer.add_vision_attention_layernorm_eps(CLIP_NORM_EPS)
    writer.add_vision_image_mean(list(IMAGE_MEAN))
    writer.add_vision_image_std(list(IMAGE_STD))
    writer.add_vision_use_gelu(True)
    for name, weight in _clip_weights(vision, lm_hidden_size).items():
        writer.add_tensor(name, np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


IMAGE_TOKEN = "<image>"
"""The MLX vision model's image placeholder: an added special token after the trained
vocabulary (id = TINY_SPEC.vocab_size), which LLaVA's processor repeats once per image
embedding. Its embedding row is overwritten by the image features; its lm_head row is zero
(never generated), like the other special tokens."""


def _clip_hf_weights(vision: TinyVisionSpec, lm_hidden_size: int) -> dict[str, np.ndarray]:
    """HF LLaVA vision tower (CLIP) and projector tensors, float32, in a fixed order; the
    same init as `_clip_weights` (llama.cpp's names), under the names mlx-vlm's llava reads."""
    h, ff, p = vision.hidden_size, vision.intermediate_size, vision.patch_size
    weights, noise, linear, norm = _tower_builders(vision)

    tower = "vision_tower.vision_model"
    noise(f"{tower}.embeddings.class_embedding", (h,), EMBED_STD)
    noise(f"{tower}.embeddings.patch_embedding.weight", (h, 3, p, p), HIDDEN_GAIN / math.sqrt(3 * p * p))
    noise(f"{tower}.embeddings.position_embedding.weight", (vision.image_tokens + 1, h), EMBED_STD)
    norm(f"{tower}.pre_layrnorm")  # (sic: CLIP's spelling)
    for i in range(vision.num_layers):
        b = f"{tower}.encoder.layers.{i}"
        norm(f"{b}.layer_norm1")
        for name in ("q_proj", "k_proj", "v_proj"):
            linear(f"{b}.self_attn.{name}", h, h)
        linear(f"{b}.self_attn.out_proj", h, h, RESIDUAL_GAIN)
        norm(f"{b}.layer_norm2")
        linear(f"{b}.mlp.fc1", ff, h)
        linear(f"{b}.mlp.fc2", h, ff, RESIDUAL_GAIN)
    norm(f"{tower}.post_layernorm")
    linear("multi_modal_projector.linear_1", lm_hidden_size, h)
    linear("multi_modal_projector.linear_2", lm_hidden_size, lm_hidden_size, vision.projection_gain)
    return weights


def write_mlx_vlm(hf_dir: Path, spec: TinySpec, vision: TinyVisionSpec) -> None:
    """A LLaVA safetensors folder mlx-vlm loads: `spec`'s language model (the tokenizer plus
    IMAGE_TOKEN, so the LM's vocabulary is one larger), `vision`'s CLIP tower and projector
    (the image's `vision.image_tokens` patch embeddings; the class token is dropped)."""
    from safetensors.numpy import save_file
    from tokenizers import AddedToken

    tokenizer = train_tokenizer(spec)
    tokenizer.add_special_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False)])
    image_id = tokenizer.get_vocab()[IMAGE_TOKEN]
    lm_spec = replace(spec, vocab_size=tokenizer.get_vocab_size())
    lm = _hf_weights(lm_spec, [tokenizer.get_vocab()[t] for t in (*SPECIAL_TOKENS, IMAGE_TOKEN)])
    _write_hf(hf_dir, lm_spec, tokenizer, lm)
    weights = {f"language_model.{name}": weight for name, weight in lm.items()}
    weights.update(_clip_hf_weights(vision, spec.hidden_size))
    save_file({name: np.ascontiguousarray(w) for name, w in weights.items()}, str(hf_dir / "model.safetensors"),
              metadata={"format": "pt"})
    os.chmod(hf_dir / "model.safetensors", 0o644)
    text_config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    del text_config["architectures"]
    _write_json(hf_dir / "config.json", {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "text_config": text_config,
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": vision.hidden_size,
            "intermediate_size": vision.intermediate_size,
            "num_hidden_layers": vision.num_layers,
            "num_attention_heads": vision.num_attention_heads,
            "image_size": vision.image_size,
            "patch_size": vision.patch_size,
            "projection_dim": spec.hidden_size,
            "num_channels": 3,
            "layer_norm_eps": CLIP_NORM_EPS,
            "hidden_act": "gelu",
        },
        "image_token_index": image_id,
        # The last layer's patches (llama.cpp's mlp projector reads the last layer too).
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
        "projector_hidden_act": "gelu",
        "vocab_size": lm_spec.vocab_size,
        "bos_token_id": text_config["bos_token_id"],
        "eos_token_id": text_config["eos_token_id"],
        "tie_word_embeddings": False,
        "torch_dtype": spec.dtype,
    })
    _write_json(hf_dir / "preprocessor_config.json", {
        "image_processor_type": "CLIPImageProcessor",
        "processor_class": "LlavaProcessor",
        "do_resize": True,
        "size": {"shortest_edge": vision.image_size},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": vision.image_size, "width": vision.image_size},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(IMAGE_MEAN),
        "image_std": list(IMAGE_STD),
        "do_convert_rgb": True,
    })
    _write_json(hf_dir / "processor_config.json", {
        "processor_class": "LlavaProcessor",
        "patch_size": vision.patch_size,
        "vision_feature_select_strategy": "default",
        "image_token": IMAGE_TOKEN,
        "num_additional_image_tokens": 1,  # the class token, dropped by "default"
    })
    tokenizer_config = json.loads((hf_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    tokenizer_config["added_tokens_decoder"][str(image_id)] = {
        "content": IMAGE_TOKEN, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
        "special": True,
    }
    tokenizer_config["processor_class"] = "LlavaProcessor"
    _write_json(hf_dir / "tokenizer_config.json", tokenizer_config)


GEMMA3_BOI_TOKEN = "<start_of_image>"
GEMMA3_IMAGE_TOKEN = "<image_soft_token>"
GEMMA3_EOI_TOKEN = "<end_of_image>"
GEMMA3_PAD_TOKEN = "<pad>"
GEMMA3_TOKENS: tuple[str, ...] = (GEMMA3_PAD_TOKEN, GEMMA3_BOI_TOKEN, GEMMA3_IMAGE_TOKEN, GEMMA3_EOI_TOKEN)
"""The Gemma 3 VLM's added special tokens, after the trained vocabulary in this order. The
prompt holds `<start_of_image>` per image; Gemma 3's processor expands it to
`\n\n<start_of_image>` + `<image_soft_token>` x image_seq_length + `<end_of_image>\n\n`, and
mlx-vlm's gemma3 puts the image's embeddings where the soft tokens are. `<pad>` is the
config's pad_token_id (mlx-vlm zeroes that token's embedding), so no real token is padding."""


GEMMA3_EMBED_STD = 0.02
"""Gemma 3 ties its output layer to the token embeddings (mlx-vlm's gemma3 always does) and
multiplies the embeddings by sqrt(hidden_size) on the way in. At EMBED_STD (1.0) a token's own
embedding dominates the last hidden state and the tied logits echo the prompt's last token
for ever (measured: twelve newlines for any image); at Gemma's own init scale the layers'
unit-RMS outputs dominate and greedy decoding follows the prompt and the image."""


def _gemma3_lm_weights(spec: TinySpec, silent_token_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """Gemma 3's text tensors: the Llama tensors of `_hf_weights` plus the per-head q/k norms
    and the feed-forward pre/post norms Gemma 3 adds. Gemma's RMSNorm scales by (1 + weight),
    so a unit norm is all zeros. No lm_head: it is the embedding (tied), whose rows of
    `silent_token_ids` are zero, so those tokens' logit is 0 and they are never generated
    (nor seen: a zero embedding adds nothing to the residual)."""
    weights = _hf_weights(spec, silent_token_ids)
    del weights["lm_head.weight"]
    embed = "model.embed_tokens.weight"
    weights[embed] = _uniform(spec.seed, embed, (spec.vocab_size, spec.hidden_size), GEMMA3_EMBED_STD)
    weights[embed][list(silent_token_ids)] = 0.0
    zeros_h = np.zeros(spec.hidden_size, dtype=np.float32)
    for name in list(weights):
        if name.endswith("norm.weight"):
            weights[name] = zeros_h.copy()
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        weights[f"{p}.self_attn.q_norm.weight"] = np.zeros(spec.head_dim, dtype=np.float32)
        weights[f"{p}.self_attn.k_norm.weight"] = np.zeros(spec.head_dim, dtype=np.float32)
        weights[f"{p}.pre_feedforward_layernorm.weight"] = zeros_h.copy()
        weights[f"{p}.post_feedforward_layernorm.weight"] = zeros_h.copy()
    return dict(sorted(weights.items()))


def _siglip_hf_weights(vision: TinyVisionSpec, lm_hidden_size: int) -> dict[str, np.ndarray]:
    """Gemma 3's SigLIP tower (no class token, no pre-norm) and its projector (an RMS norm,
    Gemma-style (1 + weight), then one matrix into the LM), float32, in a fixed order."""
    h, ff, p = vision.hidden_size, vision.intermediate_size, vision.patch_size
    weights, noise, linear, norm = _tower_builders(vision)

    tower = "vision_tower.vision_model"
    noise(f"{tower}.embeddings.patch_embedding.weight", (h, 3, p, p), HIDDEN_GAIN / math.sqrt(3 * p * p))
    weights[f"{tower}.embeddings.patch_embedding.bias"] = np.zeros(h, dtype=np.float32)
    noise(f"{tower}.embeddings.position_embedding.weight", (vision.image_tokens, h), EMBED_STD)
    for i in range(vision.num_layers):
        b = f"{tower}.encoder.layers.{i}"
        norm(f"{b}.layer_norm1")
        for name in ("q_proj", "k_proj", "v_proj"):
            linear(f"{b}.self_attn.{name}", h, h)
        linear(f"{b}.self_attn.out_proj", h, h, RESIDUAL_GAIN)
        norm(f"{b}.layer_norm2")
        linear(f"{b}.mlp.fc1", ff, h)
        linear(f"{b}.mlp.fc2", h, ff, RESIDUAL_GAIN)
    norm(f"{tower}.post_layernorm")
    weights["multi_modal_projector.mm_soft_emb_norm.weight"] = np.zeros(h, dtype=np.float32)
    # (in, out), as mlx-vlm's einsum reads it. The image features are divided by
    # sqrt(hidden_size) and then multiplied back by the LM's embedding scale, so the gain
    # alone sets how loud an image is against the unit-scale token embeddings.
    noise("multi_modal_projector.mm_input_projection_weight", (h, lm_hidden_size),
          vision.projection_gain / math.sqrt(h))
    return weights


def write_mlx_vlm_gemma3(hf_dir: Path, spec: TinySpec, vision: TinyVisionSpec) -> None:
    """A Gemma 3 VLM safetensors folder mlx-vlm's gemma3 loads: a Gemma 3 language model of
    `spec`'s shape (the tokenizer plus GEMMA3_TOKENS, so the vocabulary is four larger), a
    SigLIP tower of `vision`'s shape, Gemma 3's projector, and the Gemma 3 processor and
    image processor configs (`vision.image_tokens` soft tokens per image, no pooling)."""
    from safetensors.numpy import save_file
    from tokenizers import AddedToken

    tokenizer = train_tokenizer(spec)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA3_TOKENS])
    vocab = tokenizer.get_vocab()
    lm_spec = replace(spec, vocab_size=tokenizer.get_vocab_size())
    lm = _gemma3_lm_weights(lm_spec, [vocab[t] for t in (*SPECIAL_TOKENS, *GEMMA3_TOKENS)])
    _write_hf(hf_dir, lm_spec, tokenizer, lm)
    weights = {f"language_model.{name}": weight for name, weight in lm.items()}
    weights.update(_siglip_hf_weights(vision, spec.hidden_size))
    save_file({name: np.ascontiguousarray(w) for name, w in weights.items()}, str(hf_dir / "model.safetensors"),
              metadata={"format": "pt"})
    os.chmod(hf_dir / "model.safetensors", 0o644)
    llama = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    text_config = {
        "model_type": "gemma3_text",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "query_pre_attn_scalar": spec.head_dim,
        "vocab_size": lm_spec.vocab_size,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_global_base_freq": spec.rope_theta,
        "rope_local_base_freq": spec.rope_theta,
        "sliding_window": spec.context_length,
        "sliding_window_pattern": 6,
        "max_position_embeddings": spec.context_length,
        "mm_tokens_per_image": vision.image_tokens,
    }
    _write_json(hf_dir / "config.json", {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": text_config,
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": vision.hidden_size,
            "intermediate_size": vision.intermediate_size,
            "num_hidden_layers": vision.num_layers,
            "num_attention_heads": vision.num_attention_heads,
            "image_size": vision.image_size,
            "patch_size": vision.patch_size,
            "num_channels": 3,
            "layer_norm_eps": CLIP_NORM_EPS,
        },
        "image_token_index": vocab[GEMMA3_IMAGE_TOKEN],
        "boi_token_index": vocab[GEMMA3_BOI_TOKEN],
        "eoi_token_index": vocab[GEMMA3_EOI_TOKEN],
        "mm_tokens_per_image": vision.image_tokens,
        "hidden_size": spec.hidden_size,
        "pad_token_id": vocab[GEMMA3_PAD_TOKEN],
        "vocab_size": lm_spec.vocab_size,
        "bos_token_id": llama["bos_token_id"],
        "eos_token_id": llama["eos_token_id"],
        "torch_dtype": spec.dtype,
    })
    _write_json(hf_dir / "preprocessor_config.json", {
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": "Gemma3Processor",
        "do_resize": True,
        "size": {"height": vision.image_size, "width": vision.image_size},
        "resample": 2,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(IMAGE_MEAN),
        "image_std": list(IMAGE_STD),
        "do_convert_rgb": None,
        "do_pan_and_scan": None,
        "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None,
        "pan_and_scan_min_ratio_to_activate": None,
    })
    _write_json(hf_dir / "processor_config.json", {
        "processor_class": "Gemma3Processor",
        "image_seq_length": vision.image_tokens,
    })
    tokenizer_config = json.loads((hf_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    for token in GEMMA3_TOKENS:
        tokenizer_config["added_tokens_decoder"][str(vocab[token])] = {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True,
        }
    tokenizer_config["pad_token"] = GEMMA3_PAD_TOKEN
    tokenizer_config["boi_token"] = GEMMA3_BOI_TOKEN
    tokenizer_config["eoi_token"] = GEMMA3_EOI_TOKEN
    tokenizer_config["image_token"] = GEMMA3_IMAGE_TOKEN
    tokenizer_config["extra_special_tokens"] = {
        "boi_token": GEMMA3_BOI_TOKEN, "eoi_token": GEMMA3_EOI_TOKEN, "image_token": GEMMA3_IMAGE_TOKEN,
    }
    tokenizer_config["processor_class"] = "Gemma3Processor"
    _write_json(hf_dir / "tokenizer_config.json", tokenizer_config)


QWEN2_5_VL_START_TOKEN = "<|vision_start|>"
QWEN2_5_VL_END_TOKEN = "<|vision_end|>"
QWEN2_5_VL_IMAGE_TOKEN = "<|image_pad|>"
QWEN2_5_VL_TOKENS: tuple[str, ...] = (QWEN2_5_VL_START_TOKEN, QWEN2_5_VL_END_TOKEN, "<|vision_pad|>",
                                      QWEN2_5_VL_IMAGE_TOKEN, "<|video_pad|>")
"""The Qwen2.5-VL model's added special tokens, after the trained vocabulary in this order.
Qwen's chat template writes `<|vision_start|><|image_pad|><|vision_end|>` per image; its
processor repeats `<|image_pad|>` once per merged patch (the image's grid t*h*w / merge**2),
and M-RoPE numbers those positions in 2D from `<|vision_start|>` on."""

QWEN2_5_VL_PATCH_PX = 8
QWEN2_5_VL_MERGE = 2
QWEN2_5_VL_MIN_PIXELS = 16 * 16
QWEN2_5_VL_MAX_PIXELS = 64 * 64
"""The tiny Qwen2.5-VL's image processor bounds: an image is resized to multiples of
patch * merge (16 px) within these pixel counts, so the count of image tokens follows the
image's shape (a 40x30 image: 48x32 px, 6x4 patches, 6 tokens; 64x64: 16 tokens)."""


def _qwen2_5_vl_weights(spec: TinySpec, vision: TinyVisionSpec,
                        silent_token_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """Qwen2.5-VL's tensors under mlx-vlm's names: the Llama tensors of `_hf_weights` with
    Qwen2's q/k/v biases (zero) as the language model, and a tiny Qwen2.5-VL vision tower
    (a 3D patch conv over two frames, RMS-normed blocks with a fused qkv and a gated MLP, the
    2x2 patch merger into the LM), float32, in a fixed order."""
    lm = _hf_weights(spec, silent_token_ids)
    for i in range(spec.num_layers):
        p = f"model.layers.{i}.self_attn"
        lm[f"{p}.q_proj.bias"] = np.zeros(spec.num_attention_heads * spec.head_dim, dtype=np.float32)
        for name in ("k_proj", "v_proj"):
            lm[f"{p}.{name}.bias"] = np.zeros(spec.num_key_value_heads * spec.head_dim, dtype=np.float32)
    weights = {f"language_model.{name}": weight for name, weight in sorted(lm.items())}
    h, ff, p = vision.hidden_size, vision.intermediate_size, QWEN2_5_VL_PATCH_PX
    tower, noise, linear, _ = _tower_builders(vision)
    noise("vision_tower.patch_embed.proj.weight", (h, 3, 2, p, p), HIDDEN_GAIN / math.sqrt(3 * 2 * p * p))
    for i in range(vision.num_layers):
        b = f"vision_tower.blocks.{i}"
        tower[f"{b}.norm1.weight"] = np.ones(h, dtype=np.float32)
        linear(f"{b}.attn.qkv", 3 * h, h)
        linear(f"{b}.attn.proj", h, h, RESIDUAL_GAIN)
        tower[f"{b}.norm2.weight"] = np.ones(h, dtype=np.float32)
        linear(f"{b}.mlp.gate_proj", ff, h)
        linear(f"{b}.mlp.up_proj", ff, h)
        linear(f"{b}.mlp.down_proj", h, ff, RESIDUAL_GAIN)
    merged = h * QWEN2_5_VL_MERGE ** 2
    tower["vision_tower.merger.ln_q.weight"] = np.ones(h, dtype=np.float32)
    linear("vision_tower.merger.mlp.0", merged, merged)
    linear("vision_tower.merger.mlp.2", spec.hidden_size, merged, vision.projection_gain)
    weights.update(tower)
    return weights


def write_mlx_vlm_qwen2_5_vl(hf_dir: Path, spec: TinySpec, vision: TinyVisionSpec) -> None:
    """A Qwen2.5-VL safetensors folder mlx-vlm's qwen2_5_vl loads: a Qwen2 language model of
    `spec`'s shape with M-RoPE (the tokenizer plus QWEN2_5_VL_TOKENS), a tiny Qwen2.5-VL tower
    of `vision`'s width and depth (8 px patches over two frames, 2x2 merge), and the Qwen2-VL
    image processor and Qwen2.5-VL processor configs."""
    from safetensors.numpy import save_file
    from tokenizers import AddedToken

    tokenizer = train_tokenizer(spec)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN2_5_VL_TOKENS])
    vocab = tokenizer.get_vocab()
    lm_spec = replace(spec, vocab_size=tokenizer.get_vocab_size())
    weights = _qwen2_5_vl_weights(lm_spec, vision, [vocab[t] for t in (*SPECIAL_TOKENS, *QWEN2_5_VL_TOKENS)])
    _write_hf(hf_dir, lm_spec, tokenizer, {})
    save_file({name: np.ascontiguousarray(w) for name, w in weights.items()}, str(hf_dir / "model.safetensors"),
              metadata={"format": "pt"})
    os.chmod(hf_dir / "model.safetensors", 0o644)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    half = spec.head_dim // 2
    config.update({
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        # Rotary frequencies per axis (time, height, width): they must sum to head_dim / 2.
        "rope_scaling": {"type": "mrope", "mrope_section": [half - 2 * (half * 3 // 8), half * 3 // 8,
                                                             half * 3 // 8]},
        "vision_config": {
            "model_type": "qwen2_5_vl",
            "depth": vision.num_layers,
            "hidden_size": vision.hidden_size,
            "intermediate_size": vision.intermediate_size,
            "num_heads": vision.num_attention_heads,
            "out_hidden_size": spec.hidden_size,
            "patch_size": QWEN2_5_VL_PATCH_PX,
            "spatial_patch_size": QWEN2_5_VL_PATCH_PX,
            "spatial_merge_size": QWEN2_5_VL_MERGE,
            "temporal_patch_size": 2,
            "in_channels": 3,
            # 32 px windows (2x2 merged units); the last block attends to the whole image.
            "window_size": 2 * QWEN2_5_VL_MERGE * QWEN2_5_VL_PATCH_PX,
            "fullatt_block_indexes": [vision.num_layers - 1],
            "tokens_per_second": 2,
        },
        "image_token_id": vocab[QWEN2_5_VL_IMAGE_TOKEN],
        "video_token_id": vocab["<|video_pad|>"],
        "vision_start_token_id": vocab[QWEN2_5_VL_START_TOKEN],
        "vision_end_token_id": vocab[QWEN2_5_VL_END_TOKEN],
        "vision_token_id": vocab["<|vision_pad|>"],
    })
    _write_json(hf_dir / "config.json", config)
    _write_json(hf_dir / "preprocessor_config.json", {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor",
        "do_resize": True,
        "resample": 3,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(IMAGE_MEAN),
        "image_std": list(IMAGE_STD),
        "do_convert_rgb": True,
        "min_pixels": QWEN2_5_VL_MIN_PIXELS,
        "max_pixels": QWEN2_5_VL_MAX_PIXELS,
        "size": {"shortest_edge": QWEN2_5_VL_MIN_PIXELS, "longest_edge": QWEN2_5_VL_MAX_PIXELS},
        "patch_size": QWEN2_5_VL_PATCH_PX,
        "temporal_patch_size": 2,
        "merge_size": QWEN2_5_VL_MERGE,
    })
    tokenizer_config = json.loads((hf_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    for token in QWEN2_5_VL_TOKENS:
        tokenizer_config["added_tokens_decoder"][str(vocab[token])] = {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True,
        }
    tokenizer_config["processor_class"] = "Qwen2_5_VLProcessor"
    _write_json(hf_dir / "tokenizer_config.json", tokenizer_config)


def _tree_size_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def generate_tiny_model(out_dir: Path, spec: TinySpec, vision: TinyVisionSpec | None = None) -> TinyArtifacts:
    """Write the HF folder `out_dir/hf/` and the GGUF file `out_dir/model.gguf` for `spec`
    (and `out_dir/mmproj.gguf` for `vision`). `out_dir` may exist but must not already hold
    any artifact. Deterministic: the same spec (and corpus) gives byte-identical files."""
    out_dir = Path(out_dir)
    hf_dir, gguf_path = out_dir / HF_DIR_NAME, out_dir / GGUF_FILE_NAME
    projector_path = out_dir / PROJECTOR_FILE_NAME if vision is not None else None
    for existing in (hf_dir, gguf_path, *((projector_path,) if projector_path is not None else ())):
        if existing.exists():
            raise FileExistsError(f"{existing} already exists; generate into an empty directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec)
    weights = _hf_weights(spec, [tokenizer.get_vocab()[token] for token in SPECIAL_TOKENS])  # trained with them
    _write_hf(hf_dir, spec, tokenizer, weights)
    _write_gguf(gguf_path, spec, tokenizer, weights)
    if vision is not None and projector_path is not None:
        _write_mmproj(projector_path, vision, spec.hidden_size)
    return TinyArtifacts(
        hf_dir=hf_dir,
        gguf_path=gguf_path,
        hf_size_bytes=_tree_size_bytes(hf_dir),
        gguf_size_bytes=gguf_path.stat().st_size,
        spec_hash=spec_hash(spec, vision),
        projector_path=projector_path,
    )


# ---------------------------------------------------------------------------------------
# Resolving cards to artifacts
# ---------------------------------------------------------------------------------------


MlxVlmFamily = Literal["llava", "gemma3", "qwen2_5_vl"]
"""The mlx-vlm families the generator writes (`MLX_VLM_WRITERS`)."""


@dataclass(frozen=True)
class GeneratedModel:
    """Where a local-generated card's artifacts live under the models dir, and their spec."""

    dir_name: str
    spec: TinySpec
    vision: TinyVisionSpec | None = None
    """The projector written beside model.gguf (`PROJECTOR_FILE_NAME`) for a vision card."""
    mlx_vlm: bool = False
    """Write only hf/, as a model for mlx-vlm of `mlx_vlm_family` (`MLX_VLM_WRITERS`), with
    `vision`'s tower."""
    mlx_vlm_family: MlxVlmFamily = "llava"

MLX_VLM_WRITERS: Mapping[str, tuple[Callable[[Path, TinySpec, TinyVisionSpec], None], int, str]] = {
    "llava": (write_mlx_vlm, 1, "-mlx-vlm"),
    "gemma3": (write_mlx_vlm_gemma3, len(GEMMA3_TOKENS), "-mlx-vlm-gemma3"),
    "qwen2_5_vl": (write_mlx_vlm_qwen2_5_vl, len(QWEN2_5_VL_TOKENS), "-mlx-vlm-qwen2_5_vl"),
}
"""An mlx-vlm family's writer, how many tokens it adds to the trained vocabulary (the card's
vocab_size is that much larger), and its spec-hash suffix (a layout change regenerates)."""


LOCAL_GENERATED_MODELS: Mapping[str, GeneratedModel] = {
    "local/tiny-llama": GeneratedModel("local--tiny-llama", TINY_SPEC),
    "local/tiny-llama-gguf": GeneratedModel("local--tiny-llama", TINY_SPEC),
    "local/tiny-vlm-gguf": GeneratedModel("local--tiny-vlm", TINY_SPEC, TINY_VISION_SPEC),
    "local/tiny-vlm": GeneratedModel("local--tiny-vlm-mlx", TINY_SPEC, TINY_VISION_SPEC, mlx_vlm=True),
    "local/tiny-gemma3-vlm": GeneratedModel("local--tiny-gemma3-vlm", TINY_SPEC, TINY_VISION_SPEC, mlx_vlm=True,
                                            mlx_vlm_family="gemma3"),
    "local/tiny-qwen2.5-vl": GeneratedModel("local--tiny-qwen2.5-vl", TINY_SPEC, TINY_VISION_SPEC, mlx_vlm=True,
                                            mlx_vlm_family="qwen2_5_vl"),
}
"""Generated cards by model id. Both tiny cards share one directory: the HF card resolves to
its hf/ folder, the GGUF card (the one with a llama.cpp backend) to its model.gguf. The
vision card has its own directory (the same LM plus mmproj.gguf); so has the MLX vision card
(hf/ only: a LLaVA folder for mlx-vlm), and so has the Gemma 3 one (a Gemma 3 folder, the
same shapes with Gemma 3's norms, SigLIP tower and projector) and the Qwen2.5-VL one (a
Qwen2 LM with M-RoPE and Qwen2.5-VL's windowed tower and patch merger)."""


def generated_projector_path(model_path: Path) -> Path:
    """Where a generated vision model's projector lies, given the model.gguf
    `ensure_generated` returned: beside it, named `PROJECTOR_FILE_NAME`."""
    return Path(model_path).parent / PROJECTOR_FILE_NAME


def _shape_mismatches(card: ModelCard, spec: TinySpec) -> list[str]:
    pairs = {
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "context_length": spec.context_length,
    }
    return [
        f"{field}={getattr(card, field)} (generator: {value})"
        for field, value in pairs.items()
        if getattr(card, field) != value
    ]


def _marker_matches(model_dir: Path, expected_hash: str, vision: bool = False, gguf: bool = True) -> bool:
    try:
        marker = json.loads((model_dir / MARKER_FILE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("spec_hash") == expected_hash
        and (model_dir / HF_DIR_NAME).is_dir()
        and (not gguf or (model_dir / GGUF_FILE_NAME).is_file())
        and (not vision or not gguf or (model_dir / PROJECTOR_FILE_NAME).is_file())
    )


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path, model_id: str, timeout_s: float) -> Iterator[None]:
    """`file_lock.exclusive_file_lock` failing as this model's ArtifactUnavailable."""
    with exclusive_file_lock(lock_path, timeout_s, lambda _kind, message: ArtifactUnavailable(model_id, message),
                             poll_s=LOCK_POLL_INTERVAL_S):
        yield


def _remove_leftovers(models_dir: Path, dir_name: str) -> None:
    """Partial and stale directories of dead generators (only a lock holder calls this)."""
    for pattern in (f".{dir_name}.partial-*", f".{dir_name}.stale-*"):
        for leftover in models_dir.glob(pattern):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())


def _swap_into_place(models_dir: Path, dir_name: str, partial: Path, target: Path) -> None:
    """Rename a finished partial directory to `target`. A directory cannot be renamed over a
    non-empty one: a stale one is moved aside first. An engine still reading the stale model
    loses it; it was the wrong model anyway."""
    if target.exists():
        stale = Path(tempfile.mkdtemp(dir=models_dir, prefix=f".{dir_name}.stale-"))
        os.replace(target, stale / "old")
        os.replace(partial, target)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        os.replace(partial, target)


def _generate_in_place(models_dir: Path, model_id: str, generated: GeneratedModel, expected_hash: str) -> None:
    """Generate into a partial directory beside the target and rename it into place. The
    caller holds the lock."""
    target = models_dir / generated.dir_name
    _remove_leftovers(models_dir, generated.dir_name)
    partial = Path(tempfile.mkdtemp(dir=models_dir, prefix=f".{generated.dir_name}.partial-"))
    try:
        logger.info("generating %s (spec %s) into %s", model_id, expected_hash[:12], target)
        if generated.mlx_vlm and generated.vision is not None:
            MLX_VLM_WRITERS[generated.mlx_vlm_family][0](partial / HF_DIR_NAME, generated.spec, generated.vision)
        elif generated.vision is None:
            generate_tiny_model(partial, generated.spec)
        else:
            generate_tiny_model(partial, generated.spec, generated.vision)
        _write_json(
            partial / MARKER_FILE_NAME,
            {"spec_hash": expected_hash, "generator_version": GENERATOR_VERSION, "spec": asdict(generated.spec),
             **({"layout": "mlx-vlm"} if generated.mlx_vlm else {}),
             **({"family": generated.mlx_vlm_family} if generated.mlx_vlm and generated.mlx_vlm_family != "llava"
                else {}),
             **({"vision": asdict(generated.vision)} if generated.vision is not None else {})},
        )
        _fsync_tree(partial)
        _swap_into_place(models_dir, generated.dir_name, partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def ensure_generated(card: ModelCard, models_dir: Path) -> Path:
    """A local-generated card's files under `models_dir`: generated on first use, reused
    after, regenerated when the generator's spec hash changes; safe for concurrent callers
    on one machine. The path an engine loads: the HF folder (MLX) or the .gguf (llama.cpp).
    A vision card's projector lies beside its .gguf (`generated_projector_path`)."""
    speech = SPEECH_GENERATORS.get(card.model_id)
    if speech is not None:
        return _ensure_speech(card.model_id, speech, Path(models_dir))
    generated = LOCAL_GENERATED_MODELS.get(card.model_id)
    if generated is None:
        raise ArtifactUnavailable(
            card.model_id,
            f"no generator for this id (generated models: {sorted({*LOCAL_GENERATED_MODELS, *SPEECH_GENERATORS})})"
        )
    # An MLX vision model's LM has its image tokens after the trained vocabulary.
    _, added_tokens, hash_suffix = MLX_VLM_WRITERS[generated.mlx_vlm_family]
    mismatches = _shape_mismatches(card, replace(generated.spec, vocab_size=generated.spec.vocab_size + added_tokens)
                                   if generated.mlx_vlm else generated.spec)
    if mismatches:
        raise ArtifactUnavailable(
            card.model_id, "the card's shape differs from what the generator makes: " + ", ".join(mismatches)
        )
    models_dir = Path(models_dir)
    target = models_dir / generated.dir_name
    expected_hash = spec_hash(generated.spec, generated.vision) + (hash_suffix if generated.mlx_vlm else "")
    vision = generated.vision is not None
    gguf = not generated.mlx_vlm
    if not _marker_matches(target, expected_hash, vision, gguf):
        models_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive_lock(models_dir / f"{generated.dir_name}.lock", card.model_id, GENERATION_LOCK_TIMEOUT_S):
            # Another node sharing this models dir may have finished while we waited.
            if not _marker_matches(target, expected_hash, vision, gguf):
                _generate_in_place(models_dir, card.model_id, generated, expected_hash)
    return target / GGUF_FILE_NAME if card.is_gguf else target / HF_DIR_NAME


def _speech_marker(model_id: str, speech: GeneratedSpeechModel) -> dict[str, object]:
    return {"model_id": model_id, "speech_version": speech.version, "generator_version": GENERATOR_VERSION}


def _speech_marker_matches(target: Path, expected: dict[str, object]) -> bool:
    try:
        return json.loads((target / MARKER_FILE_NAME).read_text(encoding="utf-8")) == expected
    except (OSError, ValueError):
        return False


def _ensure_speech(model_id: str, speech: GeneratedSpeechModel, models_dir: Path) -> Path:
    """A generated speech model's directory (`skulk.models.tiny_speech`), written on first
    use the way `ensure_generated` writes the text models: under the lock, into a partial
    directory renamed into place, regenerated when its version changes."""
    target = models_dir / speech.dir_name
    expected = _speech_marker(model_id, speech)
    if not _speech_marker_matches(target, expected):
        models_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive_lock(models_dir / f"{speech.dir_name}.lock", model_id, GENERATION_LOCK_TIMEOUT_S):
            if not _speech_marker_matches(target, expected):
                _remove_leftovers(models_dir, speech.dir_name)
                partial = Path(tempfile.mkdtemp(dir=models_dir, prefix=f".{speech.dir_name}.partial-"))
                try:
                    logger.info("generating %s (%s) into %s", model_id, speech.version, target)
                    speech.write(partial)
                    _write_json(partial / MARKER_FILE_NAME, expected)
                    _fsync_tree(partial)
                    _swap_into_place(models_dir, speech.dir_name, partial, target)
                except BaseException:
                    shutil.rmtree(partial, ignore_errors=True)
                    raise
    return target / speech.entry if speech.entry else target


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m skulk.models.tiny_models OUT_DIR [--bench]`: write a model, print a summary."""
    parser = argparse.ArgumentParser(
        prog="python -m skulk.models.tiny_models",
        description="Write the project's generated Llama model (HF folder + GGUF) deterministically.",
    )
    parser.add_argument("out_dir", type=Path, help="directory to write hf/ and model.gguf into")
    parser.add_argument(
        "--bench", action="store_true", help="write the benchmark-sized model (BENCH_SPEC) instead of TINY_SPEC"
    )
    args = parser.parse_args(argv)
    spec = BENCH_SPEC if args.bench else TINY_SPEC
    try:
        artifacts = generate_tiny_model(args.out_dir, spec)
    except (FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    summary = {
        "hf_dir": str(artifacts.hf_dir),
        "gguf_path": str(artifacts.gguf_path),
        "hf_size_bytes": artifacts.hf_size_bytes,
        "gguf_size_bytes": artifacts.gguf_size_bytes,
        "parameter_count": spec.parameter_count,
        "spec_hash": artifacts.spec_hash,
    }
    print(json.dumps(summary, indent=2))
    return 0


__all__ = [
    "BENCH_SPEC",
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "END_OF_TEXT_TOKEN",
    "EOS_TOKEN",
    "EOT_TOKEN",
    "GEMMA3_BOI_TOKEN",
    "GEMMA3_EOI_TOKEN",
    "GEMMA3_IMAGE_TOKEN",
    "GEMMA3_TOKENS",
    "GGUF_FILE_NAME",
    "HF_DIR_NAME",
    "IMAGE_TOKEN",
    "LOCAL_GENERATED_MODELS",
    "MARKER_FILE_NAME",
    "PROJECTOR_FILE_NAME",
    "QWEN2_5_VL_END_TOKEN",
    "QWEN2_5_VL_IMAGE_TOKEN",
    "QWEN2_5_VL_START_TOKEN",
    "QWEN2_5_VL_TOKENS",
    "SPECIAL_TOKENS",
    "TINY_DRAFT_SPEC",
    "TINY_SPEC",
    "TINY_VISION_SPEC",
    "ArtifactUnavailable",
    "GeneratedModel",
    "TinyArtifacts",
    "TinySpec",
    "TinyVisionSpec",
    "corpus_path",
    "ensure_generated",
    "generate_tiny_model",
    "generated_projector_path",
    "main",
    "spec_hash",
    "train_tokenizer",
    "write_mlx_vlm",
    "write_mlx_vlm_gemma3",
    "write_mlx_vlm_qwen2_5_vl",
]

if __name__ == "__main__":
    raise SystemExit(main())
