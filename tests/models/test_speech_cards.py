"""Speech cards from a repo's files, as tables: a Whisper's languages and translation, a Piper
repo's voice choice, a voice's speakers and name, and the refusals naming what is missing."""

from __future__ import annotations

import pytest

from skulk.models.card_builder import CardBuildError
from skulk.models.ctranslate2_header import WhisperShape
from skulk.models.hub_files import RepoFile
from skulk.models.speech_cards import (
    card_from_piper,
    card_from_whisper,
    choose_piper_voice,
    is_piper_repo,
    missing_whisper_files,
    piper_voices,
    vocabulary_tokens,
    whisper_languages,
)

TOKENS = ["a", "b", "<|endoftext|>", "<|en|>", "<|de|>", "<|yue|>", "<|translate|>"]
SMALL = WhisperShape(vocab_size=51865, d_model=768, decoder_layers=12, decoder_heads=12, text_positions=448,
                     quantization="f16")


@pytest.mark.parametrize(("config", "expected"), [
    ({"lang_ids": [3, 4, 5]}, ("en", "de", "yue")),
    ({"lang_ids": []}, ("en",)),            # an English-only Whisper names none
    ({}, ("en",)),
    ({"lang_ids": [3, 3]}, ("en",)),
])
def test_whisper_languages(config, expected):
    assert whisper_languages("m", config, TOKENS) == expected


@pytest.mark.parametrize(("config", "says"), [
    ({"lang_ids": [99]}, "does not have"),
    ({"lang_ids": [0]}, "not a language token"),
    ({"lang_ids": "en"}, "not a list"),
])
def test_whisper_languages_refusals(config, says):
    with pytest.raises(CardBuildError, match=says):
        whisper_languages("m", config, TOKENS)


@pytest.mark.parametrize(("config", "translates"), [({"lang_ids": [3, 4]}, True), ({"lang_ids": []}, False)])
def test_a_whisper_card(config, translates):
    card = card_from_whisper("acme/faster-whisper-small", SMALL, config, TOKENS, {"sampling_rate": 16000}, 486_000_000,
                             revision="a" * 40)
    assert (card.num_layers, card.hidden_size, card.num_attention_heads, card.head_dim) == (12, 768, 12, 64)
    assert card.artifact_format == "ctranslate2" and card.quantization == "f16" and card.tasks == ("Transcription",)
    assert card.audio is not None and card.audio.supports_translation is translates
    assert card.audio.sample_rate == 16000 and card.source_revision == "a" * 40


def test_a_whisper_without_a_preprocessor_hears_16_khz():
    card = card_from_whisper("acme/w", SMALL, {}, TOKENS, None, 10)
    assert card.audio is not None and card.audio.sample_rate == 16000


@pytest.mark.parametrize(("names", "missing"), [
    (["model.bin", "config.json", "tokenizer.json", "vocabulary.txt"], []),
    (["model.bin", "config.json", "tokenizer.json", "vocabulary.json", "preprocessor_config.json"], []),
    (["model.bin", "config.json", "vocabulary.txt"], ["tokenizer.json"]),
    (["model.bin", "config.json", "tokenizer.json", "sub/vocabulary.txt"], ["vocabulary.json or vocabulary.txt"]),
])
def test_missing_whisper_files(names, missing):
    assert missing_whisper_files([RepoFile(n, 1) for n in names]) == missing


def test_vocabulary_tokens_by_id():
    assert vocabulary_tokens("vocabulary.json", ["a", ""]) == ["a", ""]
    assert vocabulary_tokens("vocabulary.txt", "a\nb\n")[:2] == ["a", "b"]


VOICES = ["en/en_US/a/low/en_US-a-low.onnx", "de/de_DE/b/low/de_DE-b-low.onnx"]


def _listing(paths):
    return [RepoFile(p, 10) for p in paths]


@pytest.mark.parametrize(("paths", "named", "expected"), [
    ([VOICES[0], f"{VOICES[0]}.json"], None, VOICES[0]),                       # the only voice
    ([*VOICES, *(f"{v}.json" for v in VOICES)], VOICES[1], VOICES[1]),
    ([*VOICES, *(f"{v}.json" for v in VOICES)], None, "holds 2 Piper voices"),
    ([VOICES[0]], None, "has no .onnx.json beside it"),
    ([VOICES[0], f"{VOICES[0]}.json"], "x.onnx", "no x.onnx or x.onnx.json"),
    ([VOICES[0]], VOICES[0], f"no {VOICES[0]}.json"),
])
def test_choose_piper_voice(paths, named, expected):
    if expected.endswith(".onnx"):
        assert choose_piper_voice("r", _listing(paths), named) == expected
    else:
        with pytest.raises(CardBuildError, match=expected.replace(".", r"\.")):
            choose_piper_voice("r", _listing(paths), named)


@pytest.mark.parametrize(("config", "file", "expected"), [
    ({"num_speakers": 3, "speaker_id_map": {"p1": 0, "p2": 1, "p3": 2}}, "x.onnx", ["p1", "p2", "p3"]),
    ({"num_speakers": 1, "dataset": "lessac"}, "en_US-lessac-medium.onnx", ["lessac"]),
    ({"num_speakers": 1}, "en/en_US-amy-low.onnx", ["amy"]),                 # Piper's file naming
    ({"num_speakers": 1, "dataset": "a b"}, "voice.onnx", ["voice"]),
    ({"num_speakers": 2, "speaker_id_map": {}}, "x.onnx", "no speaker_id_map"),
    ({"num_speakers": 2, "speaker_id_map": {"a b": 0, "c": 1}}, "x.onnx", "not voice names"),
])
def test_piper_voices(config, file, expected):
    if isinstance(expected, list):
        assert piper_voices("r", file, config) == expected
    else:
        with pytest.raises(CardBuildError, match=expected):
            piper_voices("r", file, config)


def test_a_piper_card_and_its_refusals():
    config = {"audio": {"sample_rate": 22050}, "num_symbols": 256, "language": {"code": "de_DE"},
              "num_speakers": 1, "dataset": "thorsten"}
    card = card_from_piper("rhasspy/piper-voices", "de/de_DE-thorsten-medium.onnx", config, 63_000_000)
    assert card.artifact_format == "onnx" and card.onnx_file == "de/de_DE-thorsten-medium.onnx"
    assert card.audio is not None and (card.audio.voices, card.audio.default_voice) == (("thorsten",), "thorsten")
    assert card.audio.languages == ("de",) and card.audio.sample_rate == 22050 and card.vocab_size == 256
    for broken, says in (({**config, "audio": {}}, "audio.sample_rate"), ({**config, "num_symbols": 0}, "num_symbols")):
        with pytest.raises(CardBuildError, match=says):
            card_from_piper("r/v", "v.onnx", broken, 10)


@pytest.mark.parametrize(("paths", "expected"), [
    ([VOICES[0], f"{VOICES[0]}.json"], True),
    (["v.onnx"], True),                                                      # refused later, naming the config
    (["config.json", "model.safetensors", "onnx/model.onnx"], False),        # a transformers repo's ONNX export
    (["config.json", "model.safetensors"], False),
])
def test_is_piper_repo(paths, expected):
    assert is_piper_repo(_listing(paths)) is expected
