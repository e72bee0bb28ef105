"""The generated Piper voice (local/tiny-piper): a voice piper-tts itself loads and speaks
with, written deterministically by the node's own resolution path, whose config covers every
phoneme espeak-ng gives for ordinary English text and whose sound depends on text, voice and
speed (`tests/worker/engines/speech/test_piper_voice.py` drives it through the engine)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from skulk.artifacts.resolve import ensure_local_model
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.models.tiny_piper import CONFIG_FILE, HOP_LENGTH, MODEL_FILE, SAMPLE_RATE, VOICES, onnx_model, voice_config

CARD = load_card(builtin_cards_dir() / "local--tiny-piper.toml")

PANGRAM = "The quick brown fox jumps over the lazy dog! Sphinx of black quartz, judge my vow? Zoë's façade, 1 2 3."


@pytest.fixture(scope="module")
def voice(tmp_path_factory):
    from piper.voice import PiperVoice

    model = ensure_local_model(CARD, tmp_path_factory.mktemp("models"))
    return PiperVoice.load(model, config_path=model.parent / CONFIG_FILE)


def test_the_node_generates_the_voice_its_card_describes(tmp_path):
    model = ensure_local_model(CARD, tmp_path)
    assert model.name == MODEL_FILE and (model.parent / CONFIG_FILE).is_file()
    config = json.loads((model.parent / CONFIG_FILE).read_text(encoding="utf-8"))
    assert CARD.audio is not None and CARD.family == "vits" and CARD.artifact_format == "onnx"
    assert CARD.audio.sample_rate == config["audio"]["sample_rate"] == SAMPLE_RATE
    assert set(CARD.audio.voices) == set(config["speaker_id_map"]) == set(VOICES)
    assert CARD.audio.default_voice == VOICES[0]
    actual = model.stat().st_size + (model.parent / CONFIG_FILE).stat().st_size
    assert abs(CARD.storage_size_bytes - actual) <= actual * 0.15
    # Written again on the same dir: reused as is (the marker matches).
    before = model.stat().st_mtime_ns
    assert ensure_local_model(CARD, tmp_path) == model and model.stat().st_mtime_ns == before


def test_the_voice_is_the_same_bytes_every_time():
    assert onnx_model() == onnx_model()
    assert voice_config() == voice_config()


def test_the_id_map_is_pipers_standard_one_and_covers_espeaks_english(voice):
    from piper.phoneme_ids import DEFAULT_PHONEME_ID_MAP

    ids = voice.config.phoneme_id_map
    assert (ids["_"], ids["^"], ids["$"]) == ([0], [1], [2])
    assert dict(ids) == {k: list(v) for k, v in DEFAULT_PHONEME_ID_MAP.items()}
    assert max(i for v in ids.values() for i in v) < voice.config.num_symbols
    sentences = voice.phonemize(PANGRAM)
    assert len(sentences) == 3
    missing = {p for sentence in sentences for p in sentence if p not in ids}
    assert not missing, f"espeak-ng phonemes without an id: {missing}"


def test_piper_speaks_with_it_and_the_sound_depends_on_text_voice_and_speed(voice):
    from piper.config import SynthesisConfig

    def say(text: str, speaker: int = 0, length_scale: float = 1.0) -> np.ndarray:
        chunks = list(voice.synthesize(text, SynthesisConfig(speaker_id=speaker, length_scale=length_scale)))
        return np.concatenate([c.audio_int16_array for c in chunks])

    hello = say("Hello there.")
    ids = voice.phonemes_to_ids(voice.phonemize("Hello there.")[0])
    assert len(hello) == len(ids) * HOP_LENGTH  # a hop of samples per phoneme id
    assert np.abs(hello).max() > 10_000  # sound, not silence
    assert not np.array_equal(hello, say("Goodbye now."))
    assert len(hello) == len(say("Hello there.", speaker=1)) and not np.array_equal(hello, say("Hello there.", 1))
    assert len(say("Hello there.", length_scale=2.0)) == 2 * len(hello)
    assert np.array_equal(hello, say("Hello there."))  # deterministic: noise scales are ignored
