"""Tiny random GGUF models of llama.cpp architectures beyond the project's built-in seven.

The project's own generator (`skulk.models.tiny_models`) writes one Llama network, and the
built-in cards cover llama/qwen2/qwen3/mistral/gemma2/gemma3/phi3. Tests that must show a
node serving some other architecture through a real engine (llama.cpp via llama-cpp-python),
including a mixture of experts, need a GGUF of that architecture that loads and generates;
no hub is reachable in tests, so this module writes them: a few hundred KB each, random
weights, in well under a second.

Every file carries the generated tiny model's tokenizer (the same byte-level BPE vocabulary,
merges, special token ids and Llama-3 chat template as `tiny_models._write_gguf` writes), so
chat formatting and stop tokens behave the same whatever the architecture. Weights are f32,
deterministic (seeded `tiny_models._uniform` streams keyed by tensor name) and scaled like
the tiny Llama's (EMBED_STD, HIDDEN_GAIN, RESIDUAL_GAIN, LOGIT_STD), so greedy output is
varied text rather than one repeated token. The special tokens' output rows are zero: a
random model never emits them and generation runs to max_tokens.

Tensor names come from gguf-py (`gguf.TENSOR_NAMES`, checked against `gguf.MODEL_TENSORS`
for the architecture); which tensors and hyperparameters each architecture needs follows
llama.cpp's per-architecture `load_arch_hparams`/`load_arch_tensors` (src/models/<arch>.cpp).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from skulk.models.tiny_models import (
    BOS_TOKEN,
    CHAT_TEMPLATE,
    EMBED_STD,
    EOS_TOKEN,
    EOT_TOKEN,
    HIDDEN_GAIN,
    LOGIT_STD,
    RESIDUAL_GAIN,
    SPECIAL_TOKENS,
    TINY_SPEC,
    _uniform,
    train_tokenizer,
)

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
FFN = 128
CONTEXT = 2048
EXPERTS = 4
EXPERTS_USED = 2
EXPERT_FFN = 64
SHARED_EXPERT_FFN = 64
ROPE_THETA = 10000.0
NORM_EPS = 1e-5
SLIDING_WINDOW = 128
VOCAB = TINY_SPEC.vocab_size

MOE_ARCH = "qwen3moe"

T = gguf.MODEL_TENSOR


class _Tensors:
    """The tensors of one file, in insertion order, named through gguf-py and checked
    against the architecture's tensor list."""

    def __init__(self, arch: str, seed: int) -> None:
        self.arch = arch
        self.seed = seed
        self._allowed = set(gguf.MODEL_TENSORS[_ARCH_ENUMS[arch]])
        self.arrays: dict[str, np.ndarray] = {}

    def name(self, tensor: gguf.MODEL_TENSOR, bid: int | None, suffix: str) -> str:
        if tensor not in self._allowed:
            raise ValueError(f"gguf-py lists no {tensor.name} tensor for {self.arch}")
        base = gguf.TENSOR_NAMES[tensor]
        return f"{base.format(bid=bid) if bid is not None else base}.{suffix}"

    def uniform(self, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
        """Noise keyed by (seed, arch, tensor name): architectures sharing tensor names
        still get different weights, so their outputs tell them apart."""
        return _uniform(self.seed, f"{self.arch}/{name}", shape, std)

    def linear(self, tensor: gguf.MODEL_TENSOR, bid: int | None, out_f: int, in_f: int, gain: float) -> None:
        """A weight of numpy shape (out, in), i.e. llama.cpp ne = {in, out}."""
        name = self.name(tensor, bid, "weight")
        self.arrays[name] = self.uniform(name, (out_f, in_f), gain / math.sqrt(in_f))

    def experts(self, tensor: gguf.MODEL_TENSOR, bid: int, out_f: int, in_f: int, gain: float) -> None:
        """Stacked expert weights: numpy (n_expert, out, in), i.e. ne = {in, out, n_expert}."""
        name = self.name(tensor, bid, "weight")
        self.arrays[name] = self.uniform(name, (EXPERTS, out_f, in_f), gain / math.sqrt(in_f))

    def ones(self, tensor: gguf.MODEL_TENSOR, bid: int | None, *shape: int) -> None:
        self.arrays[self.name(tensor, bid, "weight")] = np.ones(shape, dtype=np.float32)

    def zeros(self, tensor: gguf.MODEL_TENSOR, bid: int | None, suffix: str, *shape: int) -> None:
        self.arrays[self.name(tensor, bid, suffix)] = np.zeros(shape, dtype=np.float32)


_ARCH_ENUMS: dict[str, gguf.MODEL_ARCH] = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}


# ---------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------


def _norm(t: _Tensors, tensor: gguf.MODEL_TENSOR, bid: int | None, size: int, layer_norm: bool) -> None:
    t.ones(tensor, bid, size)
    if layer_norm:
        t.zeros(tensor, bid, "bias", size)


def _embeddings(t: _Tensors) -> None:
    name = t.name(T.TOKEN_EMBD, None, "weight")
    t.arrays[name] = t.uniform(name, (VOCAB, HIDDEN), EMBED_STD)


def _output(t: _Tensors, *, layer_norm: bool = False, bias: bool = False) -> None:
    _norm(t, T.OUTPUT_NORM, None, HIDDEN, layer_norm)
    t.linear(T.OUTPUT, None, VOCAB, HIDDEN, LOGIT_STD)
    name = t.name(T.OUTPUT, None, "weight")
    t.arrays[name][: len(SPECIAL_TOKENS)] = 0.0  # ids 0..4: never generated (see SPECIAL_TOKENS)
    if bias:
        t.zeros(T.OUTPUT, None, "bias", VOCAB)


def _attention(t: _Tensors, i: int, *, kv_heads: int = KV_HEADS, qkv_bias: bool = False, o_bias: bool = False) -> None:
    q_out, kv_out = HEADS * HEAD_DIM, kv_heads * HEAD_DIM
    t.linear(T.ATTN_Q, i, q_out, HIDDEN, HIDDEN_GAIN)
    t.linear(T.ATTN_K, i, kv_out, HIDDEN, HIDDEN_GAIN)
    t.linear(T.ATTN_V, i, kv_out, HIDDEN, HIDDEN_GAIN)
    t.linear(T.ATTN_OUT, i, HIDDEN, q_out, RESIDUAL_GAIN)
    if qkv_bias:
        t.zeros(T.ATTN_Q, i, "bias", q_out)
        t.zeros(T.ATTN_K, i, "bias", kv_out)
        t.zeros(T.ATTN_V, i, "bias", kv_out)
    if o_bias:
        t.zeros(T.ATTN_OUT, i, "bias", HIDDEN)


def _gated_ffn(t: _Tensors, i: int) -> None:
    t.linear(T.FFN_GATE, i, FFN, HIDDEN, HIDDEN_GAIN)
    t.linear(T.FFN_UP, i, FFN, HIDDEN, HIDDEN_GAIN)
    t.linear(T.FFN_DOWN, i, HIDDEN, FFN, RESIDUAL_GAIN)


def _plain_ffn(t: _Tensors, i: int) -> None:
    """up -> gelu -> down, with biases (phi2, starcoder2)."""
    t.linear(T.FFN_UP, i, FFN, HIDDEN, HIDDEN_GAIN)
    t.zeros(T.FFN_UP, i, "bias", FFN)
    t.linear(T.FFN_DOWN, i, HIDDEN, FFN, RESIDUAL_GAIN)
    t.zeros(T.FFN_DOWN, i, "bias", HIDDEN)


def _moe_ffn(t: _Tensors, i: int, *, biases: bool = False) -> None:
    t.linear(T.FFN_GATE_INP, i, EXPERTS, HIDDEN, HIDDEN_GAIN)
    t.experts(T.FFN_GATE_EXP, i, EXPERT_FFN, HIDDEN, HIDDEN_GAIN)
    t.experts(T.FFN_UP_EXP, i, EXPERT_FFN, HIDDEN, HIDDEN_GAIN)
    t.experts(T.FFN_DOWN_EXP, i, HIDDEN, EXPERT_FFN, RESIDUAL_GAIN)
    if biases:
        t.zeros(T.FFN_GATE_INP, i, "bias", EXPERTS)
        t.zeros(T.FFN_GATE_EXP, i, "bias", EXPERTS, EXPERT_FFN)
        t.zeros(T.FFN_UP_EXP, i, "bias", EXPERTS, EXPERT_FFN)
        t.zeros(T.FFN_DOWN_EXP, i, "bias", EXPERTS, HIDDEN)


def _shared_expert(t: _Tensors, i: int) -> None:
    name = t.name(T.FFN_GATE_INP_SHEXP, i, "weight")
    t.arrays[name] = t.uniform(name, (HIDDEN,), HIDDEN_GAIN / math.sqrt(HIDDEN))
    t.linear(T.FFN_GATE_SHEXP, i, SHARED_EXPERT_FFN, HIDDEN, HIDDEN_GAIN)
    t.linear(T.FFN_UP_SHEXP, i, SHARED_EXPERT_FFN, HIDDEN, HIDDEN_GAIN)
    t.linear(T.FFN_DOWN_SHEXP, i, HIDDEN, SHARED_EXPERT_FFN, RESIDUAL_GAIN)


# ---------------------------------------------------------------------------------------
# Architectures: tensors, and the KVs beyond the common ones
# ---------------------------------------------------------------------------------------


def _rms_pre_norm(t: _Tensors, ffn: Callable[[_Tensors, int], None], **attention: bool) -> None:
    """The Llama layout: attn_norm, attention, ffn_norm, ffn (RMS norms)."""
    _embeddings(t)
    for i in range(LAYERS):
        t.ones(T.ATTN_NORM, i, HIDDEN)
        _attention(t, i, **attention)
        t.ones(T.FFN_NORM, i, HIDDEN)
        ffn(t, i)
    _output(t)


def _qwen3moe(t: _Tensors, w: gguf.GGUFWriter) -> None:
    _embeddings(t)
    for i in range(LAYERS):
        t.ones(T.ATTN_NORM, i, HIDDEN)
        _attention(t, i)
        t.ones(T.ATTN_Q_NORM, i, HEAD_DIM)
        t.ones(T.ATTN_K_NORM, i, HEAD_DIM)
        t.ones(T.FFN_NORM, i, HIDDEN)
        _moe_ffn(t, i)
    _output(t)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(EXPERTS_USED)
    w.add_expert_feed_forward_length(EXPERT_FFN)


def _qwen2moe(t: _Tensors, w: gguf.GGUFWriter) -> None:
    def ffn(t: _Tensors, i: int) -> None:
        _moe_ffn(t, i)
        _shared_expert(t, i)

    _rms_pre_norm(t, ffn, qkv_bias=True)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(EXPERTS_USED)
    w.add_expert_feed_forward_length(EXPERT_FFN)
    w.add_expert_shared_feed_forward_length(SHARED_EXPERT_FFN)


def _olmo2(t: _Tensors, w: gguf.GGUFWriter) -> None:
    """Post-norm: no input norms; norms after attention and after the MLP, and q/k norms
    over the whole projection."""
    _embeddings(t)
    for i in range(LAYERS):
        _attention(t, i)
        t.ones(T.ATTN_Q_NORM, i, HEADS * HEAD_DIM)
        t.ones(T.ATTN_K_NORM, i, KV_HEADS * HEAD_DIM)
        t.ones(T.ATTN_POST_NORM, i, HIDDEN)
        _gated_ffn(t, i)
        t.ones(T.FFN_POST_NORM, i, HIDDEN)
    _output(t)


def _granite(t: _Tensors, w: gguf.GGUFWriter) -> None:
    _rms_pre_norm(t, _gated_ffn)
    w.add_embedding_scale(1.0)
    w.add_residual_scale(1.0)
    w.add_logit_scale(1.0)
    w.add_attention_scale(1.0 / math.sqrt(HEAD_DIM))


def _smollm3(t: _Tensors, w: gguf.GGUFWriter) -> None:
    _rms_pre_norm(t, _gated_ffn)


def _internlm2(t: _Tensors, w: gguf.GGUFWriter) -> None:
    _rms_pre_norm(t, _gated_ffn)


def _phi2(t: _Tensors, w: gguf.GGUFWriter) -> None:
    """Parallel attention and MLP from one LayerNorm; biases everywhere; partial rotary;
    no grouped-query attention (all heads have their own k/v)."""
    _embeddings(t)
    for i in range(LAYERS):
        _norm(t, T.ATTN_NORM, i, HIDDEN, layer_norm=True)
        _attention(t, i, kv_heads=HEADS, qkv_bias=True, o_bias=True)
        _plain_ffn(t, i)
    _output(t, layer_norm=True, bias=True)


def _starcoder2(t: _Tensors, w: gguf.GGUFWriter) -> None:
    _embeddings(t)
    for i in range(LAYERS):
        _norm(t, T.ATTN_NORM, i, HIDDEN, layer_norm=True)
        _attention(t, i, qkv_bias=True, o_bias=True)
        _norm(t, T.FFN_NORM, i, HIDDEN, layer_norm=True)
        _plain_ffn(t, i)
    _output(t, layer_norm=True)


def _stablelm(t: _Tensors, w: gguf.GGUFWriter) -> None:
    _embeddings(t)
    for i in range(LAYERS):
        _norm(t, T.ATTN_NORM, i, HIDDEN, layer_norm=True)
        _attention(t, i, qkv_bias=True)
        _norm(t, T.FFN_NORM, i, HIDDEN, layer_norm=True)
        _gated_ffn(t, i)
    _output(t, layer_norm=True)


def _gpt_oss(t: _Tensors, w: gguf.GGUFWriter) -> None:
    """gpt-oss: attention sinks, alternating sliding-window layers, biased experts (f32
    here; real checkpoints store experts in MXFP4, which llama.cpp does not require)."""
    _embeddings(t)
    for i in range(LAYERS):
        t.ones(T.ATTN_NORM, i, HIDDEN)
        _attention(t, i, qkv_bias=True, o_bias=True)
        t.zeros(T.ATTN_SINKS, i, "weight", HEADS)
        t.ones(T.ATTN_POST_NORM, i, HIDDEN)
        _moe_ffn(t, i, biases=True)
    _output(t)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(EXPERTS_USED)
    w.add_expert_feed_forward_length(EXPERT_FFN)
    w.add_sliding_window(SLIDING_WINDOW)


_LAYER_NORM_ARCHS = frozenset({"phi2", "starcoder2", "stablelm"})
_ROPE_DIMS = {"phi2": HEAD_DIM // 2, "stablelm": HEAD_DIM // 4}
"""Partial rotary, as the real checkpoints use; every other arch rotates the whole head."""
_KV_HEADS = {"phi2": HEADS}

_BUILDERS: dict[str, Callable[[_Tensors, gguf.GGUFWriter], None]] = {
    "qwen3moe": _qwen3moe,
    "olmo2": _olmo2,
    "granite": _granite,
    "phi2": _phi2,
    "smollm3": _smollm3,
    "starcoder2": _starcoder2,
    "qwen2moe": _qwen2moe,
    "stablelm": _stablelm,
    "internlm2": _internlm2,
    "gpt-oss": _gpt_oss,
}

TINY_ARCHS: tuple[str, ...] = tuple(_BUILDERS)
"""The architectures `write_tiny_arch_gguf` writes, each verified to load and generate with
the installed llama-cpp-python (tests/models/test_tiny_archs.py)."""


# ---------------------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------------------


@functools.cache
def _tokenizer_metadata() -> tuple[list[str], list[str], dict[str, int]]:
    """(tokens by id, merges, special token ids) of the generated tiny model's tokenizer."""
    tokenizer = train_tokenizer(TINY_SPEC)
    vocab = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
    if [i for _, i in vocab] != list(range(VOCAB)):
        raise RuntimeError("tokenizer ids are not contiguous")
    merges = [f"{left} {right}" for left, right in json.loads(tokenizer.to_str())["model"]["merges"]]
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    return [token for token, _ in vocab], merges, ids


def _add_tokenizer(writer: gguf.GGUFWriter) -> None:
    """The same tokenizer KVs as `tiny_models._write_gguf`."""
    tokens, merges, ids = _tokenizer_metadata()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(ids[BOS_TOKEN])
    writer.add_eos_token_id(ids[EOS_TOKEN])
    writer.add_eot_token_id(ids[EOT_TOKEN])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_tiny_arch_gguf(path: Path, arch: str, seed: int = 0) -> Path:
    """Write a tiny random model of llama.cpp architecture `arch` (one of TINY_ARCHS) to
    `path` and return it. Deterministic: the same (arch, seed) gives the same bytes."""
    if arch not in _BUILDERS:
        raise ValueError(f"no tiny writer for architecture {arch!r} (have: {', '.join(TINY_ARCHS)})")
    path = Path(path)
    kv_heads = _KV_HEADS.get(arch, KV_HEADS)
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_name(f"Skulk tiny {arch} (generated)")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(VOCAB)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(_ROPE_DIMS.get(arch, HEAD_DIM))
    writer.add_rope_freq_base(ROPE_THETA)
    if arch in _LAYER_NORM_ARCHS:
        writer.add_layer_norm_eps(NORM_EPS)
    else:
        writer.add_layer_norm_rms_eps(NORM_EPS)

    tensors = _Tensors(arch, seed)
    _BUILDERS[arch](tensors, writer)
    _add_tokenizer(writer)
    for name, array in tensors.arrays.items():
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


__all__ = ["MOE_ARCH", "TINY_ARCHS", "write_tiny_arch_gguf"]
