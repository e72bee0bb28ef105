"""The faster-whisper engine in-process, on the generated `local/tiny-whisper` (a real
CTranslate2 Whisper with random weights): audio reaches the model (duration, different text
for different speech), the request's options are honoured or refused typed, streaming yields
segment by segment then one final result, and closing the stream stops decoding."""

from __future__ import annotations

import pytest

from skulk.models.tiny_models import ensure_generated
from skulk.shared.types.cards import AudioSection
from skulk.shared.types.workload_io import TranscriptionParams
from skulk.worker.engines.base import EngineNotLoaded, ModelLoadFailed, ShardSpec, WorkloadUnsupported
from skulk.worker.engines.speech.whisper import (
    AudioRejected,
    TranscriptionUnsupported,
    WhisperEngine,
    device_of,
    refusal,
)
from tests.speech_kit import RUNNER, TINY_WHISPER, spoken_wav, tiny_whisper_card, wav_duration_s
from tests.speech_kit import whisper_instance as instance

pytestmark = pytest.mark.timeout(120)

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ensure_generated(tiny_whisper_card(), tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def engine(model_dir):
    engine = WhisperEngine()
    engine.load(ShardSpec(instance=instance(), runner_id=RUNNER, card=tiny_whisper_card(), model_path=str(model_dir),
                          n_threads=1))
    engine.warm_up()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    out = tmp_path_factory.mktemp("wav")
    return (spoken_wav("hello world, this is a test", out / "a.wav"),
            spoken_wav("the quick brown fox jumps over the lazy dog and keeps on running", out / "b.wav"))


def params(data: bytes, **fields) -> TranscriptionParams:
    return TranscriptionParams.of_audio(TINY_WHISPER, data, **fields)


def test_the_generated_model_is_small_and_deterministic(model_dir, tmp_path):
    again = ensure_generated(tiny_whisper_card(), tmp_path)
    for name in ("model.bin", "tokenizer.json", "vocabulary.json", "config.json", "preprocessor_config.json"):
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name
    assert sum(p.stat().st_size for p in model_dir.iterdir()) < tiny_whisper_card().storage_size_bytes


def test_audio_reaches_the_model(engine, speech):
    first, second = speech
    (one,) = engine.transcribe(params(first))
    (two,) = engine.transcribe(params(second))
    assert one.final and two.final
    assert one.duration == pytest.approx(wav_duration_s(first), abs=0.01)
    assert two.duration == pytest.approx(wav_duration_s(second), abs=0.01)
    assert one.text and two.text and one.text != two.text
    assert one.segments and all(0 <= s.start <= s.end <= one.duration + 0.5 for s in one.segments)
    (again,) = engine.transcribe(params(first))
    assert again.text == one.text, "temperature 0 decodes greedily: the same audio, the same text"


def test_streaming_yields_each_segment_then_the_whole(engine, speech):
    results = list(engine.transcribe(params(speech[1], stream=True)))
    *partial, final = results
    assert partial and all(not r.final and len(r.segments) == 1 for r in partial)
    assert final.final and [s.text for s in final.segments] == [r.text for r in partial]
    assert final.text == "".join(r.text for r in partial).strip()


def test_closing_the_stream_stops_decoding(engine, speech):
    stream = engine.transcribe(params(speech[1], stream=True))
    first = next(stream)
    assert not first.final
    stream.close()
    assert engine.in_flight == 0
    (whole,) = engine.transcribe(params(speech[0]))  # the engine serves on
    assert whole.final


def test_options_are_honoured(engine, speech):
    (words,) = engine.transcribe(params(speech[0], word_timestamps=True))
    assert any(s.words for s in words.segments)
    assert all(w.start <= w.end for s in words.segments for w in s.words)
    (german,) = engine.transcribe(params(speech[0], language="de"))
    assert german.language == "de"
    (translated,) = engine.transcribe(params(speech[0], task="translate", prompt="Skulk"))
    assert translated.final and translated.text


def test_refusals_are_typed(engine, speech):
    with pytest.raises(TranscriptionUnsupported, match="language 'xx'"):
        list(engine.transcribe(params(speech[0], language="xx")))
    with pytest.raises(AudioRejected, match="does not decode as audio"):
        list(engine.transcribe(params(b"this is not audio at all, just text" * 10)))
    tampered = params(speech[0]).model_copy(update={"audio_sha256": "0" * 64})
    with pytest.raises(AudioRejected, match="SHA-256"):
        list(engine.transcribe(tampered))
    with pytest.raises(WorkloadUnsupported):
        engine.generate(None, None)  # type: ignore[arg-type]


def test_an_unloaded_or_misplaced_engine_refuses():
    with pytest.raises(EngineNotLoaded):
        list(WhisperEngine().transcribe(params(b"x")))
    with pytest.raises(ModelLoadFailed, match="not a faster_whisper backend"):
        WhisperEngine().load(ShardSpec(instance=instance("llama_cpp-cpu"), runner_id=RUNNER, card=tiny_whisper_card(),
                                       model_path="/nowhere"))
    with pytest.raises(ModelLoadFailed, match="no CTranslate2 Whisper model"):
        WhisperEngine().load(ShardSpec(instance=instance(), runner_id=RUNNER, card=tiny_whisper_card(),
                                       model_path="/nowhere"))


def card_with(**audio) -> object:
    card = tiny_whisper_card()
    return card.model_copy(update={"audio": AudioSection(sample_rate=16000, **audio)})


LANGS = frozenset({"en", "de"})


@pytest.mark.parametrize(("fields", "audio", "multilingual", "why"), [
    ({}, {}, True, None),
    ({"task": "translate"}, {"supports_translation": True}, True, None),
    ({"task": "translate"}, {}, True, "does not translate"),
    ({"task": "translate"}, {"supports_translation": True}, False, "does not translate"),
    ({"word_timestamps": True}, {}, True, "no word timestamps"),
    ({"stream": True}, {}, True, "does not stream"),
    ({"language": "de"}, {}, True, None),
    ({"language": "fr"}, {}, True, "language 'fr'"),
    ({"language": "de"}, {"languages": ("en",)}, True, "language 'de'"),
])
def test_refusal_rules(fields, audio, multilingual, why):
    found = refusal(params(b"x", **fields), card_with(**audio), LANGS, multilingual)  # type: ignore[arg-type]
    assert (found is None) if why is None else (found is not None and why in found)


@pytest.mark.parametrize(("backend", "device"), [
    ("faster_whisper", "cpu"), ("faster_whisper-cpu", "cpu"), ("faster_whisper-cuda", "cuda"),
])
def test_device_of(backend, device):
    assert device_of(backend) == device
