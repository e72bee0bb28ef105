"""Speech model cards built from a repository's own files: a CTranslate2 Whisper (the
faster-whisper format) and a Piper voice (an ONNX model and its `.onnx.json`).

- A CTranslate2 Whisper repo ships `model.bin` (the weights; the decoder's shape is read from
  its variable records by `skulk.models.ctranslate2_header`), CTranslate2's `config.json`
  (`lang_ids`: the language tokens' ids), a vocabulary (`vocabulary.txt` / `.json`, by id) and
  `tokenizer.json` (faster-whisper's tokenizer), and usually `preprocessor_config.json` (the
  sample rate and mel bins). It becomes a Transcription card: the languages are the tokens
  `lang_ids` names (`<|de|>` -> 'de'); a model with several translates into English; the
  sample rate is the preprocessor's, else Whisper's 16 kHz.
- A Piper voice is `<name>.onnx` with `<name>.onnx.json` beside it; one repo may hold many
  (rhasspy/piper-voices), so the caller names the file then (`onnx_file`), as a GGUF file
  is named in a multi-quant repo. It becomes a SpeechSynthesis card: the sample rate, the
  language and the speakers (its voices) come from the `.onnx.json`.

Pure: the caller (`skulk.models.hub_cards`) reads the files; this module never does I/O.
Every refusal is a `CardBuildError` naming what is missing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from skulk.models.card_builder import CardBuildError
from skulk.models.ctranslate2_header import WhisperShape
from skulk.models.hub_files import RepoFile
from skulk.shared.types.cards import ModelCard

WHISPER_SAMPLE_RATE_HZ = 16000
"""What every Whisper hears, when the repo ships no preprocessor_config.json."""
WHISPER_BACKENDS = ("faster_whisper", "faster_whisper-cpu", "faster_whisper-cuda")
WHISPER_PREFERENCE = ("faster_whisper-cuda", "faster_whisper-cpu", "faster_whisper")
PIPER_BACKENDS = ("piper", "piper-cpu")
PIPER_PREFERENCE = ("piper-cpu", "piper")
"""The engine lists the built-in speech cards use (resources/model_cards)."""

WHISPER_VOCABULARY_FILES = ("vocabulary.json", "vocabulary.txt")
"""CTranslate2's vocabulary, one of which every converted Whisper ships (by token id)."""
WHISPER_REQUIRED_FILES = ("model.bin", "config.json", "tokenizer.json")
"""What faster-whisper loads besides a vocabulary: a repo without one of them is refused."""

VITS_TEXT_ENCODER = {"num_layers": 6, "hidden_size": 192, "num_attention_heads": 2, "num_key_value_heads": 2,
                     "head_dim": 96, "context_length": 4096}
"""A Piper voice's shape fields: VITS's text encoder as every Piper voice configures it (an
ONNX graph does not state it simply). Nominal: Piper keeps no KV cache, and memory is sized
from the file's bytes."""

_LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3})\|>$")
_VOICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


# -- Whisper ---------------------------------------------------------------------------------


def missing_whisper_files(files: Sequence[RepoFile]) -> list[str]:
    """The files faster-whisper needs that the repo's top level lacks (empty: all there)."""
    top = {f.path for f in files if "/" not in f.path}
    missing = [name for name in WHISPER_REQUIRED_FILES if name not in top]
    if not any(name in top for name in WHISPER_VOCABULARY_FILES):
        missing.append(" or ".join(WHISPER_VOCABULARY_FILES))
    return missing


def vocabulary_tokens(name: str, data: Any) -> list[str]:
    """Tokens by id from a CTranslate2 vocabulary: `vocabulary.json` (a JSON list) or
    `vocabulary.txt` (one token a line)."""
    if name.endswith(".json"):
        if not isinstance(data, list):
            raise CardBuildError(name, "vocabulary.json is not a list of tokens")
        return [str(token) for token in data]  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    return str(data).split("\n")


def whisper_languages(model_id: str, config: Mapping[str, Any], tokens: Sequence[str]) -> tuple[str, ...]:
    """The languages the model transcribes: the language tokens CTranslate2's config.json
    names by id (`lang_ids`); an English-only Whisper names none."""
    ids = config.get("lang_ids") or []
    if not isinstance(ids, list):
        raise CardBuildError(model_id, "config.json's lang_ids is not a list of token ids")
    codes: list[str] = []
    for token_id in ids:  # pyright: ignore[reportUnknownVariableType]
        if not isinstance(token_id, int) or not 0 <= token_id < len(tokens):
            raise CardBuildError(model_id, f"config.json's lang_ids names token {token_id!r}, which the vocabulary "
                                 f"({len(tokens)} tokens) does not have")
        found = _LANGUAGE_TOKEN.match(tokens[token_id])
        if found is None:
            raise CardBuildError(model_id, f"config.json's lang_ids names token {token_id} ({tokens[token_id]!r}), "
                                 "which is not a language token like <|en|>")
        if found.group(1) not in codes:
            codes.append(found.group(1))
    return tuple(codes) or ("en",)


def card_from_whisper(
    model_id: str,
    shape: WhisperShape,
    config: Mapping[str, Any],
    tokens: Sequence[str],
    preprocessor: Mapping[str, Any] | None,
    storage_size_bytes: int,
    *,
    revision: str | None = None,
    name: str | None = None,
) -> ModelCard:
    """A faster-whisper Transcription card. The shape fields are the decoder's (the part that
    keeps a KV cache): its layers, width, heads and text context."""
    languages = whisper_languages(model_id, config, tokens)
    rate = (preprocessor or {}).get("sampling_rate", WHISPER_SAMPLE_RATE_HZ)
    if not isinstance(rate, int) or rate <= 0:
        raise CardBuildError(model_id, f"preprocessor_config.json's sampling_rate {rate!r} is not a rate in Hz")
    multilingual = len(languages) > 1
    return _validated(model_id, {
        "model_id": model_id,
        "name": name or PurePosixPath(model_id).name,
        "family": "whisper",
        "source_revision": revision,
        "quantization": shape.quantization,
        "storage_size_bytes": max(1, storage_size_bytes),
        "tasks": ["Transcription"],
        "capabilities": ["stt"],
        "num_layers": shape.decoder_layers,
        "hidden_size": shape.d_model,
        "num_attention_heads": shape.decoder_heads,
        "num_key_value_heads": shape.decoder_heads,
        "head_dim": shape.d_model // shape.decoder_heads,
        "vocab_size": shape.vocab_size,
        "context_length": shape.text_positions,
        "placement": {"compatible_backends": list(WHISPER_BACKENDS), "backend_preference": list(WHISPER_PREFERENCE)},
        # faster-whisper streams segments, times words and transcribes committed realtime
        # utterances for every Whisper; only a multilingual one translates.
        "audio": {"sample_rate": rate, "languages": list(languages), "supports_translation": multilingual,
                  "supports_streaming": True, "supports_realtime": True, "supports_word_timestamps": True},
    })


# -- Piper -----------------------------------------------------------------------------------


def piper_voice_files(files: Sequence[RepoFile]) -> list[str]:
    """The repo's Piper voices: every `.onnx` with its `.onnx.json` beside it, by path."""
    present = {f.path for f in files}
    return sorted(p for p in present if p.endswith(".onnx") and f"{p}.json" in present)


def is_piper_repo(files: Sequence[RepoFile]) -> bool:
    """Whether the repo is read as Piper voices: it holds a voice (an `.onnx` with its
    `.onnx.json`), or ONNX models and no top-level config.json (then it is refused as a
    voice, naming what it lacks). A transformers repo that ships an `onnx/` export beside
    its config.json is not one: it stays a safetensors repo."""
    if piper_voice_files(files):
        return True
    return any(f.path.endswith(".onnx") for f in files) and not any(f.path == "config.json" for f in files)


def choose_piper_voice(model_id: str, files: Sequence[RepoFile], onnx_file: str | None) -> str:
    """The voice a card of the repo means: `onnx_file` when given (it and its config must be
    there), else the repo's only voice. Several voices and none named is refused, naming a few."""
    present = {f.path for f in files}
    if onnx_file is not None:
        missing = [p for p in (onnx_file, f"{onnx_file}.json") if p not in present]
        if missing:
            raise CardBuildError(model_id, f"the repository has no {' or '.join(missing)} (a Piper voice is its .onnx "
                                 "and the .onnx.json beside it)")
        return onnx_file
    voices = piper_voice_files(files)
    if not voices:
        lone = sorted(p for p in present if p.endswith(".onnx"))
        raise CardBuildError(model_id, f"{lone[0] if lone else 'its .onnx'} has no .onnx.json beside it: a Piper voice "
                             "is the model and its config")
    if len(voices) > 1:
        shown = ", ".join(voices[:3]) + (", ..." if len(voices) > 3 else "")
        raise CardBuildError(model_id, f"the repository holds {len(voices)} Piper voices ({shown}); name one with "
                             "onnxFile (skulk models add REPO --onnx-file PATH)")
    return voices[0]


def piper_voices(model_id: str, onnx_file: str, voice_config: Mapping[str, Any]) -> list[str]:
    """The card's voices: a multi-speaker model's speakers by name (`speaker_id_map`, the names
    Piper's runner maps back to speaker ids), else one voice named for the dataset (or file)."""
    speakers = voice_config.get("speaker_id_map") or {}
    count = voice_config.get("num_speakers", 1)
    if isinstance(count, int) and count > 1:
        if not isinstance(speakers, Mapping) or not speakers:
            raise CardBuildError(model_id, f"{onnx_file}.json has {count} speakers but no speaker_id_map naming them")
        names = [str(n) for n in speakers]  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        bad = [n for n in names if not _VOICE_NAME.match(n)]
        if bad:
            raise CardBuildError(model_id, f"{onnx_file}.json names speakers {bad[:3]} that are not voice names "
                                 "(letters, digits, '_', '.', '-'; at most 64)")
        return names
    stem = PurePosixPath(onnx_file).name.removesuffix(".onnx")
    parts = stem.split("-")  # Piper's naming: <lang>_<REGION>-<dataset>-<quality>
    for candidate in (voice_config.get("dataset"), parts[1] if len(parts) == 3 else None, stem):
        if isinstance(candidate, str) and _VOICE_NAME.match(candidate):
            return [candidate]
    raise CardBuildError(model_id, f"{onnx_file}: no voice name can be made from its dataset or file name")


def card_from_piper(
    model_id: str,
    onnx_file: str,
    voice_config: Mapping[str, Any],
    storage_size_bytes: int,
    *,
    revision: str | None = None,
    name: str | None = None,
) -> ModelCard:
    """A Piper SpeechSynthesis card for `onnx_file`, from its `.onnx.json`."""
    audio = voice_config.get("audio")
    rate = audio.get("sample_rate") if isinstance(audio, Mapping) else None  # pyright: ignore[reportUnknownMemberType]
    if not isinstance(rate, int) or rate <= 0:
        raise CardBuildError(model_id, f"{onnx_file}.json states no audio.sample_rate")
    symbols = voice_config.get("num_symbols")
    if not isinstance(symbols, int) or symbols <= 0:
        raise CardBuildError(model_id, f"{onnx_file}.json states no num_symbols")
    language = voice_config.get("language")
    code = language.get("code") if isinstance(language, Mapping) else None  # pyright: ignore[reportUnknownMemberType]
    languages = [str(code).split("_")[0].lower()] if isinstance(code, str) and code else []
    languages = [c for c in languages if re.fullmatch(r"[a-z]{2,3}", c)]
    voices = piper_voices(model_id, onnx_file, voice_config)
    return _validated(model_id, {
        "model_id": model_id,
        "name": name or f"Piper voice: {PurePosixPath(onnx_file).name.removesuffix('.onnx')}",
        "family": "vits",
        "source_revision": revision,
        "onnx_file": onnx_file,
        "quantization": "f32",
        "storage_size_bytes": max(1, storage_size_bytes),
        "tasks": ["SpeechSynthesis"],
        "capabilities": ["tts"],
        **VITS_TEXT_ENCODER,
        "vocab_size": symbols,
        "placement": {"compatible_backends": list(PIPER_BACKENDS), "backend_preference": list(PIPER_PREFERENCE)},
        "audio": {"sample_rate": rate, "languages": languages, "supports_streaming": True,
                  "voices": voices, "default_voice": voices[0]},
    })


def _validated(source: str, data: Mapping[str, Any]) -> ModelCard:
    from pydantic import ValidationError

    try:
        return ModelCard.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise CardBuildError(source, f"the files do not make a valid card: {first['msg']}") from None


__all__ = [
    "PIPER_BACKENDS",
    "VITS_TEXT_ENCODER",
    "WHISPER_BACKENDS",
    "WHISPER_REQUIRED_FILES",
    "WHISPER_SAMPLE_RATE_HZ",
    "WHISPER_VOCABULARY_FILES",
    "card_from_piper",
    "card_from_whisper",
    "choose_piper_voice",
    "is_piper_repo",
    "missing_whisper_files",
    "piper_voice_files",
    "piper_voices",
    "vocabulary_tokens",
    "whisper_languages",
]
