"""The mlx-whisper engine in-process (MLX's CPU backend here), on the generated
`local/tiny-mlx-whisper` (a real Whisper in mlx-whisper's layout with random weights):
audio reaches the model (the duration is the audio's, different speech gives different
text, the same audio at temperature 0 the same text), segments carry timestamps and, when
asked, word timings; translation reaches the decoder; what the card does not declare
(streaming) is refused typed."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("mlx_whisper", reason="mlx-whisper is not installed (the dev group installs it)")

from skulk.models.tiny_models import ensure_generated
from skulk.shared.types.workload_io import TranscriptionParams
from skulk.worker.engines.base import EngineNotLoaded, ModelLoadFailed, ShardSpec, WorkloadUnsupported
from skulk.worker.engines.speech.mlx_whisper_engine import MlxWhisperEngine, segments_of, uses_fp16
from skulk.worker.engines.speech.whisper import AudioRejected, TranscriptionUnsupported
from tests.speech_kit import RUNNER, spoken_wav, wav_duration_s
from tests.speech_kit import TINY_MLX_WHISPER as TINY
from tests.speech_kit import mlx_whisper_instance as instance
from tests.speech_kit import tiny_mlx_whisper_card as tiny_card

pytestmark = pytest.mark.timeout(180)

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ensure_generated(tiny_card(), tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def engine(model_dir):
    engine = MlxWhisperEngine()
    engine.load(ShardSpec(instance=instance(), runner_id=RUNNER, card=tiny_card(), model_path=str(model_dir),
                          n_threads=1))
    engine.warm_up()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    out = tmp_path_factory.mktemp("wav")
    return (spoken_wav("hello world, this is a test", out / "a.wav"),
            spoken_wav("the quick brown fox jumps over the lazy dog", out / "b.wav"))


def params(data: bytes, **fields) -> TranscriptionParams:
    return TranscriptionParams.of_audio(TINY, data, **fields)


def test_the_generated_model_is_small_and_deterministic(model_dir, tmp_path):
    again = ensure_generated(tiny_card(), tmp_path)
    for name in ("config.json", "weights.safetensors"):
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name
    assert sum(p.stat().st_size for p in model_dir.iterdir()) < tiny_card().storage_size_bytes


def test_audio_reaches_the_model(engine, speech):
    first, second = speech
    (one,) = engine.transcribe(params(first, language="en"))
    (two,) = engine.transcribe(params(second, language="en"))
    assert one.final and two.final and one.language == "en"
    assert one.duration == pytest.approx(wav_duration_s(first), abs=0.01)
    assert two.duration == pytest.approx(wav_duration_s(second), abs=0.01)
    assert one.text and two.text and one.text != two.text
    assert one.segments and all(0 <= s.start <= s.end <= one.duration + 0.5 for s in one.segments)
    assert [s.id for s in one.segments] == list(range(len(one.segments)))
    (again,) = engine.transcribe(params(first, language="en"))
    assert again.text == one.text, "temperature 0 decodes greedily: the same audio, the same text"


def test_it_warms_up_and_decodes_on_another_thread_than_the_one_that_loaded_it(engine, model_dir, speech, tmp_path):
    # The runner loads on its main thread, warms up and decodes on its dispatcher's: MLX's
    # streams are per thread, so an array left lazy at load would fail there. A copy of the
    # model (mlx-whisper caches one model per path) loads fresh here.
    import shutil

    copy = shutil.copytree(model_dir, tmp_path / "copy")
    fresh = MlxWhisperEngine()
    fresh.load(ShardSpec(instance=instance(), runner_id=RUNNER, card=tiny_card(), model_path=str(copy), n_threads=1))
    results: list[object] = []

    def dispatcher() -> None:
        fresh.warm_up()
        results.append(next(iter(fresh.transcribe(params(speech[0], language="en")))))

    worker = threading.Thread(target=dispatcher)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive() and len(results) == 1
    (here,) = engine.transcribe(params(speech[0], language="en"))
    assert results[0] == here


def test_word_timestamps_come_back_when_asked(engine, speech):
    (plain,) = engine.transcribe(params(speech[0], language="en"))
    (timed,) = engine.transcribe(params(speech[0], language="en", word_timestamps=True))
    assert all(not s.words for s in plain.segments)
    words = [w for s in timed.segments for w in s.words]
    assert words and all(0 <= w.start <= w.end <= timed.duration + 0.5 for w in words)


def test_translation_and_prompt_reach_the_decoder(engine, speech):
    (transcribed,) = engine.transcribe(params(speech[1], language="de"))
    (translated,) = engine.transcribe(params(speech[1], language="de", task="translate"))
    # The task token differs, so a (random) decoder writes a different transcript.
    assert translated.final and translated.text != transcribed.text
    (prompted,) = engine.transcribe(params(speech[1], language="de", prompt="Skulk, Zenoh"))
    assert prompted.text != transcribed.text


def test_what_the_card_does_not_declare_is_refused(engine, speech):
    with pytest.raises(TranscriptionUnsupported, match="does not stream"):
        list(engine.transcribe(params(speech[0], stream=True)))
    with pytest.raises(TranscriptionUnsupported, match="language 'xx'"):
        list(engine.transcribe(params(speech[0], language="xx")))
    with pytest.raises(AudioRejected, match="does not decode"):
        list(engine.transcribe(params(b"not audio at all" * 64)))
    with pytest.raises(WorkloadUnsupported):
        next(iter(engine.generate(None, None)))  # type: ignore[arg-type]


def test_load_refuses_what_it_cannot_serve(tmp_path, model_dir):
    card = tiny_card()
    with pytest.raises(ModelLoadFailed, match="no mlx-whisper model"):
        MlxWhisperEngine().load(ShardSpec(instance=instance(), runner_id=RUNNER, card=card, model_path=str(tmp_path)))
    with pytest.raises(ModelLoadFailed, match="not an mlx_whisper backend"):
        MlxWhisperEngine().load(ShardSpec(instance=instance("faster_whisper-cpu"), runner_id=RUNNER, card=card,
                                          model_path=str(model_dir)))
    with pytest.raises(EngineNotLoaded):
        list(MlxWhisperEngine().transcribe(params(b"x")))


@pytest.mark.parametrize(("backend", "fp16"), [("mlx_whisper-metal", True), ("mlx_whisper-cpu", False)])
def test_the_precision_follows_the_compute(backend, fp16):
    assert uses_fp16(backend) is fp16


@pytest.mark.parametrize(("raw", "kept"), [
    ([], []),
    ([{"id": 0, "start": 0.0, "end": 1.0, "text": " hi", "tokens": [1], "avg_logprob": float("nan"),
       "no_speech_prob": 0.1, "compression_ratio": 1.0, "temperature": 0.0}], [" hi"]),
    # mlx-whisper blanks a textless segment rather than dropping it: dropped, ids renumbered.
    ([{"id": 0, "start": 0.0, "end": 0.0, "text": "", "tokens": []},
      {"id": 1, "start": 0.0, "end": 1.0, "text": " yo", "tokens": [2]}], [" yo"]),
])
def test_segments_are_mapped_numbered_and_finite(raw, kept):
    segments = segments_of(raw)
    assert [s.text for s in segments] == kept
    assert [s.id for s in segments] == list(range(len(kept)))
    assert all(s.avg_logprob == s.avg_logprob for s in segments), "no NaN reaches the wire"
