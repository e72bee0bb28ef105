"""`local/tiny-whisper`: a real multilingual Whisper in CTranslate2's format, with small
random weights, written offline without torch or a hub.

faster-whisper loads it like any converted Whisper (`ct2-transformers-converter` output):
`model.bin` + `config.json` + `vocabulary.json` (CTranslate2's `WhisperSpec`, filled here
with seeded numpy arrays), `tokenizer.json` (a byte-level BPE tokenizer from `tokenizers`
whose vocabulary is exactly the model's) and `preprocessor_config.json` (80 mel bins,
16 kHz, 30 s windows). Its text is garbage, as a random model's is; what it proves is that
audio reaches a real decoder: the encoder hears the mel features, so different audio gives
different text, and the transcript's duration is the audio's.

The vocabulary keeps Whisper's layout, which both CTranslate2 and faster-whisper read by
position and name: text tokens (the last one the empty string, by which CTranslate2 tells a
multilingual model), <|endoftext|>, <|startoftranscript|>, one token per language
faster-whisper knows, <|translate|>, <|transcribe|>, <|startoflm|>, <|startofprev|>,
<|nospeech|>, <|notimestamps|>, then the timestamps <|0.00|> .. <|30.00|>. The text tokens
are the 256 byte-level characters and a few hundred ASCII syllables, so every token decodes
to valid UTF-8 and a transcript reads as words.

Deterministic: the same code writes the same bytes (its version in
`skulk.models.tiny_speech` is bumped whenever they change) (weights from
`skulk.models.tiny_models._uniform`, files in a fixed order). Must never need the network.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from skulk.models.seeded_noise import bytes_to_unicode as _bytes_to_unicode
from skulk.models.seeded_noise import uniform as _uniform

SEED = 31
D_MODEL = 64
FFN_DIM = 128
ENCODER_LAYERS = 1
DECODER_LAYERS = 2
HEADS = 2
N_MELS = 80
AUDIO_POSITIONS = 1500
"""30 s of 10 ms mel frames, halved by the encoder's second (stride 2) convolution."""
TEXT_POSITIONS = 448
"""The decoder's context, as in every Whisper."""
SYLLABLES = 760
"""ASCII syllable tokens after the 256 byte characters (a ~1 MB model in all)."""
SYLLABLE_BIAS = 3.0
"""Added to the syllables' logits (against the embeddings' spread of about +-8)."""
TIMESTAMPS = 1501
"""<|0.00|> .. <|30.00|> in 20 ms steps."""


def _languages() -> tuple[str, ...]:
    from faster_whisper.tokenizer import _LANGUAGE_CODES  # pyright: ignore[reportPrivateUsage]

    return tuple(_LANGUAGE_CODES)


def _syllables(count: int) -> list[str]:
    """`count` distinct ASCII words, half with a leading space (Ġ in byte-level spelling),
    so that decoded text has word breaks."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    words: list[str] = []
    for c1 in consonants:
        for v1 in vowels:
            for c2 in ("", *consonants):
                words.append(c1 + v1 + c2)
    spaced = [("\u0120" + w) for w in words]
    out = [w for pair in zip(spaced, words, strict=True) for w in pair]
    if len(out) < count:
        raise ValueError(f"only {len(out)} syllables, {count} asked")
    return out[:count]


def special_tokens() -> list[str]:
    """Whisper's special tokens in their order after the text tokens."""
    return [
        "<|endoftext|>", "<|startoftranscript|>", *(f"<|{code}|>" for code in _languages()),
        "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>",
        *(f"<|{i * 0.02:.2f}|>" for i in range(TIMESTAMPS)),
    ]


def vocabulary() -> list[str]:
    """The whole vocabulary, by id."""
    byte_chars = _bytes_to_unicode()
    text = [byte_chars[b] for b in range(256)] + _syllables(SYLLABLES) + [""]
    return text + special_tokens()


def _tokenizer_json(tokens: list[str]) -> dict[str, object]:
    """A byte-level BPE tokenizer.json over `tokens` (no merges: text encodes byte by byte,
    which is all a prompt needs; decoding joins any tokens). Written as JSON directly so
    the empty-string token survives exactly as CTranslate2 expects it."""
    text_count = tokens.index("<|endoftext|>")
    added = [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i in range(text_count, len(tokens))
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {token: i for i, token in enumerate(tokens)},
            "merges": [],
        },
    }


def _linear(spec: Any, name: str, rows: int, cols: int, bias: bool = True) -> None:
    std = 1.0 / np.sqrt(cols)
    spec.weight = _uniform(SEED, f"{name}.weight", (rows, cols), float(std))
    if bias:
        spec.bias = _uniform(SEED, f"{name}.bias", (rows,), 0.02)


def _norm(spec: Any, name: str) -> None:
    spec.gamma = np.ones(D_MODEL, dtype=np.float32)
    spec.beta = _uniform(SEED, f"{name}.beta", (D_MODEL,), 0.02)


def _ffn(spec: Any, name: str) -> None:
    _norm(spec.layer_norm, f"{name}.norm")
    _linear(spec.linear_0, f"{name}.fc1", FFN_DIM, D_MODEL)
    _linear(spec.linear_1, f"{name}.fc2", D_MODEL, FFN_DIM)


def build_spec(vocab_size: int, text_count: int) -> Any:  # a ctranslate2 WhisperSpec (untyped; imported lazily)
    """The model: every variable CTranslate2's converter would set, from seeded noise. The
    output projection is the token embeddings (tied, as in Whisper)."""
    from ctranslate2.specs import whisper_spec

    spec: Any = whisper_spec.WhisperSpec(ENCODER_LAYERS, HEADS, DECODER_LAYERS, HEADS)
    encoder, decoder = spec.encoder, spec.decoder
    encoder.conv1.weight = _uniform(SEED, "enc.conv1", (D_MODEL, N_MELS, 3), float(1.0 / np.sqrt(3 * N_MELS)))
    encoder.conv1.bias = _uniform(SEED, "enc.conv1.bias", (D_MODEL,), 0.02)
    encoder.conv2.weight = _uniform(SEED, "enc.conv2", (D_MODEL, D_MODEL, 3), float(1.0 / np.sqrt(3 * D_MODEL)))
    encoder.conv2.bias = _uniform(SEED, "enc.conv2.bias", (D_MODEL,), 0.02)
    encoder.position_encodings.encodings = _uniform(SEED, "enc.pos", (AUDIO_POSITIONS, D_MODEL), 0.1)
    _norm(encoder.layer_norm, "enc.norm")
    for i, layer in enumerate(encoder.layer):
        _norm(layer.self_attention.layer_norm, f"enc.{i}.attn.norm")
        _linear(layer.self_attention.linear[0], f"enc.{i}.attn.qkv", 3 * D_MODEL, D_MODEL)
        _linear(layer.self_attention.linear[1], f"enc.{i}.attn.out", D_MODEL, D_MODEL)
        _ffn(layer.ffn, f"enc.{i}.ffn")
    embeddings = _uniform(SEED, "dec.embed", (vocab_size, D_MODEL), 1.0)
    decoder.embeddings.weight = embeddings
    decoder.position_encodings.encodings = _uniform(SEED, "dec.pos", (TEXT_POSITIONS, D_MODEL), 0.1)
    _norm(decoder.layer_norm, "dec.norm")
    decoder.projection.weight = embeddings
    # Favour the syllables over the byte tokens (a lone byte above 127 is not UTF-8), the
    # specials and the timestamps, so that a random decoder writes words between its
    # timestamps rather than stray bytes or an immediate end.
    bias = np.zeros(vocab_size, dtype=np.float32)
    bias[256:text_count - 1] = SYLLABLE_BIAS
    decoder.projection.bias = bias
    for i, layer in enumerate(decoder.layer):
        _norm(layer.self_attention.layer_norm, f"dec.{i}.self.norm")
        _linear(layer.self_attention.linear[0], f"dec.{i}.self.qkv", 3 * D_MODEL, D_MODEL)
        _linear(layer.self_attention.linear[1], f"dec.{i}.self.out", D_MODEL, D_MODEL)
        _norm(layer.attention.layer_norm, f"dec.{i}.cross.norm")
        _linear(layer.attention.linear[0], f"dec.{i}.cross.q", D_MODEL, D_MODEL)
        _linear(layer.attention.linear[1], f"dec.{i}.cross.kv", 2 * D_MODEL, D_MODEL)
        _linear(layer.attention.linear[2], f"dec.{i}.cross.out", D_MODEL, D_MODEL)
        _ffn(layer.ffn, f"dec.{i}.ffn")
    return spec


def write_tiny_whisper(out_dir: Path) -> None:
    """Writes the model's files into `out_dir` (an empty directory)."""
    tokens = vocabulary()
    text_count = tokens.index("<|endoftext|>")
    spec = build_spec(len(tokens), text_count)
    spec.register_vocabulary(tokens)
    spec.config.suppress_ids = []
    spec.config.suppress_ids_begin = [tokens.index("\u0120"), tokens.index("<|endoftext|>")]
    spec.config.lang_ids = [tokens.index(f"<|{code}|>") for code in _languages()]
    # Word timestamps align text to audio through the last decoder layer's cross-attention
    # (the converter's default for a model without published heads).
    spec.config.alignment_heads = [(DECODER_LAYERS - 1, head) for head in range(HEADS)]
    spec.validate()
    spec.optimize()
    spec.save(str(out_dir))
    (out_dir / "tokenizer.json").write_text(json.dumps(_tokenizer_json(tokens), ensure_ascii=False), encoding="utf-8")
    preprocessor = {
        "chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": N_MELS,
        "hop_length": 160, "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
        "padding_value": 0.0, "processor_class": "WhisperProcessor", "return_attention_mask": False,
        "sampling_rate": 16000,
    }
    (out_dir / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2, sort_keys=True),
                                                       encoding="utf-8")


__all__ = ["build_spec", "special_tokens", "vocabulary", "write_tiny_whisper"]
