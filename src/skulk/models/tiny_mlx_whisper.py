"""`local/tiny-mlx-whisper`: a real multilingual Whisper in mlx-whisper's layout, with small
random weights, written offline with numpy alone (no torch, no MLX, no hub).

mlx-whisper (`mlx_whisper.load_models.load_model`) loads any directory holding
`config.json` (its `ModelDimensions` fields) and `weights.safetensors` (the MLX module's
parameter names: `encoder.conv1.weight` as (out, kernel, in), attention `query`/`key`/
`value`/`out`, `mlp1`/`mlp2`, the decoder's tied `token_embedding`). The vocabulary size
is Whisper small's (51865: multilingual, 99 languages), so mlx-whisper's own tiktoken
tokenizer (shipped in its wheel) matches the model token for token; 80 mel bins, 30 s
windows, 448 tokens of context, as every Whisper before large-v3. Its text is garbage, as a
random model's is; what it proves is that audio reaches a real encoder and decoder and that
segments, timestamps and word timings come back.

Deterministic: the same code writes the same bytes (its version in
`skulk.models.tiny_speech` is bumped whenever they change), weights from
`skulk.models.tiny_models._uniform` in a fixed order. Must never need the network.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from skulk.models.seeded_noise import uniform as _uniform

SEED = 37
N_MELS = 80
AUDIO_STATE = 64
"""Width of the encoder and decoder (Whisper tiny's is 384): small enough for a ~14 MB model
that transcribes a second of audio on one CPU core in well under a second."""
HEADS = 2
AUDIO_LAYERS = 1
TEXT_LAYERS = 2
AUDIO_CONTEXT = 1500
"""30 s of 10 ms mel frames, halved by the encoder's stride-2 convolution."""
TEXT_CONTEXT = 448
VOCAB_SIZE = 51865
"""Whisper's multilingual vocabulary (tiktoken's 50257 ranks and 1608 specials: 99
languages, the task tokens, 1501 timestamps): mlx-whisper's tokenizer is built from it."""
WEIGHTS_FILE = "weights.safetensors"

EMBEDDING_STD = 0.1
"""Spread of the token embeddings. Whisper ties the output projection to them, so a large
embedding makes the decoder's best next token the one it just read (one token repeated
whatever the audio); a small one leaves the residual stream to the cross-attention, so the
audio decides the text."""
CROSS_ATTENTION_GAIN = 4.0
"""Scales the cross-attention's query and key weights: random attention is otherwise nearly
uniform over the 30 s window (mostly padding), so every recording reads alike."""
WORD_TOKENS = (1000, 50000)
"""Token ids [lo, hi) favoured over the rest: tiktoken's multi-byte words, not single bytes
(a lone byte is rarely UTF-8), specials or timestamps (which would end each segment at once)."""
WORD_BIAS = 10.0
"""The favoured tokens' logit boost, above the ~7.3 (log 1501) by which Whisper's timestamp
rule would otherwise force a timestamp after every token. mlx-whisper's decoder has no
output bias: the boost is the final norm's constant first feature (weight 0, bias 1) times
the embeddings' first column (WORD_BIAS for the favoured tokens, 0 for the rest)."""


def dimensions() -> dict[str, int]:
    """The `ModelDimensions` mlx-whisper reads from config.json."""
    return {
        "n_mels": N_MELS, "n_audio_ctx": AUDIO_CONTEXT, "n_audio_state": AUDIO_STATE, "n_audio_head": HEADS,
        "n_audio_layer": AUDIO_LAYERS, "n_vocab": VOCAB_SIZE, "n_text_ctx": TEXT_CONTEXT,
        "n_text_state": AUDIO_STATE, "n_text_head": HEADS, "n_text_layer": TEXT_LAYERS,
    }


def _linear(out: dict[str, np.ndarray], name: str, rows: int, cols: int, bias: bool = True) -> None:
    out[f"{name}.weight"] = _uniform(SEED, f"{name}.weight", (rows, cols), float(1.0 / np.sqrt(cols)))
    if bias:
        out[f"{name}.bias"] = _uniform(SEED, f"{name}.bias", (rows,), 0.02)


def _norm(out: dict[str, np.ndarray], name: str) -> None:
    out[f"{name}.weight"] = np.ones(AUDIO_STATE, dtype=np.float32)
    out[f"{name}.bias"] = _uniform(SEED, f"{name}.bias", (AUDIO_STATE,), 0.02)


def _attention(out: dict[str, np.ndarray], name: str) -> None:
    _linear(out, f"{name}.query", AUDIO_STATE, AUDIO_STATE)
    _linear(out, f"{name}.key", AUDIO_STATE, AUDIO_STATE, bias=False)  # Whisper's key has no bias
    _linear(out, f"{name}.value", AUDIO_STATE, AUDIO_STATE)
    _linear(out, f"{name}.out", AUDIO_STATE, AUDIO_STATE)


def _block(out: dict[str, np.ndarray], name: str, cross: bool) -> None:
    _attention(out, f"{name}.attn")
    _norm(out, f"{name}.attn_ln")
    if cross:
        _attention(out, f"{name}.cross_attn")
        _norm(out, f"{name}.cross_attn_ln")
    _linear(out, f"{name}.mlp1", 4 * AUDIO_STATE, AUDIO_STATE)
    _linear(out, f"{name}.mlp2", AUDIO_STATE, 4 * AUDIO_STATE)
    _norm(out, f"{name}.mlp_ln")


def weights() -> dict[str, np.ndarray]:
    """Every parameter of mlx-whisper's `Whisper` module, float32, in a fixed order. The
    encoder's positions are sinusoids computed at load (not weights)."""
    out: dict[str, np.ndarray] = {}
    # MLX convolutions are channels-last: (out_channels, kernel, in_channels).
    out["encoder.conv1.weight"] = _uniform(SEED, "enc.conv1", (AUDIO_STATE, 3, N_MELS), float(1.0 / np.sqrt(3 * N_MELS)))
    out["encoder.conv1.bias"] = _uniform(SEED, "enc.conv1.bias", (AUDIO_STATE,), 0.02)
    out["encoder.conv2.weight"] = _uniform(SEED, "enc.conv2", (AUDIO_STATE, 3, AUDIO_STATE),
                                           float(1.0 / np.sqrt(3 * AUDIO_STATE)))
    out["encoder.conv2.bias"] = _uniform(SEED, "enc.conv2.bias", (AUDIO_STATE,), 0.02)
    for i in range(AUDIO_LAYERS):
        _block(out, f"encoder.blocks.{i}", cross=False)
    _norm(out, "encoder.ln_post")
    embeddings = _uniform(SEED, "dec.embed", (VOCAB_SIZE, AUDIO_STATE), EMBEDDING_STD)
    embeddings[:, 0] = 0.0
    embeddings[WORD_TOKENS[0]:WORD_TOKENS[1], 0] = WORD_BIAS
    out["decoder.token_embedding.weight"] = embeddings
    out["decoder.positional_embedding"] = _uniform(SEED, "dec.pos", (TEXT_CONTEXT, AUDIO_STATE), 0.1)
    for i in range(TEXT_LAYERS):
        _block(out, f"decoder.blocks.{i}", cross=True)
    _norm(out, "decoder.ln")
    out["decoder.ln.weight"][0] = 0.0
    out["decoder.ln.bias"][0] = 1.0
    for name in list(out):
        if ".cross_attn.query.weight" in name or ".cross_attn.key.weight" in name:
            out[name] = out[name] * np.float32(CROSS_ATTENTION_GAIN)
    return out


def write_tiny_mlx_whisper(out_dir: Path) -> None:
    """Writes config.json and weights.safetensors into `out_dir` (an empty directory)."""
    from safetensors.numpy import save_file

    save_file(weights(), str(out_dir / WEIGHTS_FILE), metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps({"model_type": "whisper", **dimensions()}, indent=2) + "\n",
                                         encoding="utf-8")


__all__ = ["VOCAB_SIZE", "WEIGHTS_FILE", "dimensions", "weights", "write_tiny_mlx_whisper"]
