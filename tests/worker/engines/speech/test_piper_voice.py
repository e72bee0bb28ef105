"""The Piper engine in process on the generated voice (local/tiny-piper): what a request
says (text, voice, speed, stream) is what comes out, sentence by sentence when streamed; a
closed iterator stops synthesizing; a card that promises voices the model lacks, or a
missing config, is refused at load, typed."""

from __future__ import annotations

import base64
import json
import shutil
import threading

import numpy as np
import pytest

from skulk.artifacts.resolve import ensure_local_model
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.models.tiny_piper import CONFIG_FILE, SAMPLE_RATE
from skulk.shared.types.ids import ModelId
from skulk.shared.types.workload_io import SpeechParams, SpeechResult
from skulk.worker.engines.base import (
    Dispatcher,
    EngineNotLoaded,
    GeneratedResult,
    GeneratedToken,
    GenerationResult,
    ModelLoadFailed,
    ShardSpec,
    WorkloadUnsupported,
)
from skulk.worker.engines.speech.piper_voice import PiperEngine, UnknownVoice, pcm16
from tests.worker.tiny_gguf import RUNNER, tiny_instance

pytestmark = pytest.mark.timeout(120)

CARD = load_card(builtin_cards_dir() / "local--tiny-piper.toml")
assert CARD.audio is not None
AUDIO = CARD.audio
THREE_SENTENCES = "The first sentence is short. Then comes a second one! And is this the third?"


def spec(model_path, card=CARD) -> ShardSpec:
    return ShardSpec(tiny_instance(card, backend="piper-cpu"), RUNNER, card, str(model_path))


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return ensure_local_model(CARD, tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def engine(model_path):
    engine = PiperEngine()
    engine.load(spec(model_path))
    engine.warm_up()
    yield engine
    engine.close()


def say(engine: PiperEngine, text: str, **fields) -> list[SpeechResult]:
    return list(engine.synthesize(SpeechParams(model_id=ModelId(CARD.model_id), input=text, **fields)))


def samples(results: list[SpeechResult]) -> np.ndarray:
    return np.frombuffer(b"".join(base64.b64decode(r.pcm16_b64) for r in results), dtype="<i2")


def test_one_final_result_unless_streamed(engine):
    [whole] = say(engine, THREE_SENTENCES)
    assert whole.final and whole.index == 0 and whole.sample_rate == SAMPLE_RATE == engine.sample_rate
    assert len(samples([whole])) > SAMPLE_RATE // 2 and np.abs(samples([whole])).max() > 10_000


def test_streamed_speech_comes_sentence_by_sentence_and_adds_up_to_the_whole(engine):
    streamed = say(engine, THREE_SENTENCES, stream=True)
    assert [(r.index, r.final) for r in streamed] == [(0, False), (1, False), (2, True)]
    assert np.array_equal(samples(streamed), samples(say(engine, THREE_SENTENCES)))
    # The first sentence's audio is that sentence spoken alone.
    assert np.array_equal(samples(streamed[:1]), samples(say(engine, "The first sentence is short.")))


@pytest.mark.parametrize(("a", "b"), [
    (("Hello there.", None), ("Goodbye now.", None)),
    (("Hello there.", "amber"), ("Hello there.", "cedar")),
    (("Hello there.", "birch"), ("Hello there.", "cedar")),
])
def test_different_text_or_voice_is_different_audio(engine, a, b):
    assert not np.array_equal(samples(say(engine, a[0], voice=a[1])), samples(say(engine, b[0], voice=b[1])))


def test_no_voice_is_the_cards_default(engine):
    assert np.array_equal(samples(say(engine, "Hello there.")), samples(say(engine, "Hello there.", voice="amber")))


@pytest.mark.parametrize(("speed", "factor"), [(2.0, 0.5), (0.5, 2.0), (0.25, 4.0)])
def test_speed_changes_duration(engine, speed, factor):
    normal = len(samples(say(engine, THREE_SENTENCES)))
    assert abs(len(samples(say(engine, THREE_SENTENCES, speed=speed))) - normal * factor) <= 3 * 256


def test_closing_the_stream_stops_synthesizing(engine, monkeypatch):
    voice = engine._voice  # pyright: ignore[reportPrivateUsage] -- counting the model's runs
    runs = []
    real = voice.phoneme_ids_to_audio
    monkeypatch.setattr(voice, "phoneme_ids_to_audio", lambda *a, **k: runs.append(1) or real(*a, **k))
    stream = engine.synthesize(SpeechParams(model_id=ModelId(CARD.model_id), input=THREE_SENTENCES, stream=True))
    first = next(stream)
    assert not first.final and len(runs) == 1 and engine.in_flight == 1
    stream.close()
    assert len(runs) == 1 and engine.in_flight == 0


def test_punctuation_alone_is_no_samples(engine):
    [result] = say(engine, "...", stream=True)
    assert result.final and result.pcm16_b64 == ""


def test_an_unknown_voice_is_typed(engine):
    with pytest.raises(UnknownVoice, match="amber, birch, cedar"):
        say(engine, "Hello.", voice="nobody")


def test_it_serves_no_text(engine):
    with pytest.raises(WorkloadUnsupported):
        engine.generate(None, None)  # type: ignore[arg-type]


def test_pcm16_normalises_like_piper():
    assert np.frombuffer(pcm16(np.array([0.0, 0.25, -0.5])), "<i2").tolist() == [0, 16383, -32767]
    assert pcm16(np.zeros(3)) == bytes(6)


def test_load_failures_are_typed(model_path, tmp_path):
    with pytest.raises(EngineNotLoaded):
        say(PiperEngine(), "Hello.")
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    shutil.copy(model_path, lonely / model_path.name)
    with pytest.raises(ModelLoadFailed, match="config is missing"):
        PiperEngine().load(spec(lonely / model_path.name))
    # A card naming a voice the model lacks.
    audio = AUDIO.model_copy(update={"voices": ("amber", "dora"), "default_voice": "amber"})
    with pytest.raises(ModelLoadFailed, match="dora"):
        PiperEngine().load(spec(model_path, CARD.model_copy(update={"audio": audio})))
    # A card whose rate is not the voice's.
    other_rate = CARD.model_copy(update={"audio": AUDIO.model_copy(update={"sample_rate": 16000})})
    with pytest.raises(ModelLoadFailed, match="16000"):
        PiperEngine().load(spec(model_path, other_rate))
    # One speaker (a config saying so): exactly one card voice.
    single = tmp_path / "single"
    single.mkdir()
    shutil.copy(model_path, single / "v.onnx")
    config = json.loads((model_path.parent / CONFIG_FILE).read_text(encoding="utf-8"))
    config.update(num_speakers=1, speaker_id_map={})
    (single / "v.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ModelLoadFailed, match="one speaker"):
        PiperEngine().load(spec(single / "v.onnx"))
    one = CARD.model_copy(update={"audio": AUDIO.model_copy(update={"voices": ("solo",), "default_voice": None})})
    engine = PiperEngine()
    engine.load(spec(single, one))  # the directory: its one .onnx
    assert engine.sample_rate == SAMPLE_RATE
    with pytest.raises(UnknownVoice):
        say(engine, "Hi.", voice="amber")


class CancelAfterFirst:
    """A dispatch sink that cancels its request when the first sentence arrives, as the
    runner does when the API's client leaves."""

    def __init__(self) -> None:
        self.dispatcher: Dispatcher | None = None
        self.results: list[SpeechResult] = []
        self.finished = threading.Event()
        self.outcome: GenerationResult | None = None

    def on_start(self, request_id: str) -> None:
        pass

    def on_token(self, request_id: str, token: GeneratedToken | GeneratedResult) -> None:
        assert isinstance(token, GeneratedResult) and isinstance(token.result, SpeechResult)
        self.results.append(token.result)
        assert self.dispatcher is not None
        self.dispatcher.cancel(request_id)

    def on_finish(self, request_id: str, result: GenerationResult) -> None:
        self.outcome = result
        self.finished.set()


def test_a_cancel_through_the_dispatcher_stops_the_voice_between_sentences(engine, monkeypatch):
    voice = engine._voice  # pyright: ignore[reportPrivateUsage] -- counting the model's runs
    runs = []
    real = voice.phoneme_ids_to_audio
    monkeypatch.setattr(voice, "phoneme_ids_to_audio", lambda *a, **k: runs.append(1) or real(*a, **k))
    sink = CancelAfterFirst()
    dispatcher = sink.dispatcher = Dispatcher(engine, sink, engine_name="piper")
    try:
        text = " ".join(f"Sentence number {n} is here." for n in range(8))
        dispatcher.submit("r1", SpeechParams(model_id=ModelId(CARD.model_id), input=text, stream=True))
        assert sink.finished.wait(30)
    finally:
        dispatcher.close()
    assert sink.outcome is not None and sink.outcome.outcome == "cancelled"
    assert len(sink.results) == 1 and not sink.results[0].final
    # The dispatcher checks for the cancel before it asks for the next sentence: the other
    # seven are never synthesized.
    assert len(runs) == 1
