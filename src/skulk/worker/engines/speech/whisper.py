"""Speech to text through faster-whisper: a Whisper model in CTranslate2's format, on the
CPU or (a `-cuda` backend) an NVIDIA GPU, one request at a time.

`transcribe(params)` decodes the request's audio from memory (its SHA-256 checked first),
then yields the transcript: segment by segment when the request streams, else one final
result. faster-whisper decodes lazily, one 30 s window per step, so closing the iterator
(the dispatcher does, on a cancel) stops the work at the next segment.

It honours what the request asks or refuses it, typed, with a reason (`AudioRejected`,
`TranscriptionUnsupported`): never a silent fallback (a language the model lacks, a
translation or word timings the card does not declare). Audio is never written to disk
and never logged.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from skulk.shared.types.cards import backend_engine
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.workload_io import (
    AudioDigestMismatch,
    TranscriptionParams,
    TranscriptionResult,
    TranscriptSegment,
    TranscriptWord,
)
from skulk.worker.engines.base import (
    EngineBusy,
    EngineError,
    EngineNotLoaded,
    GeneratedToken,
    ModelLoadFailed,
    ShardSpec,
    WorkloadUnsupported,
)
from skulk.worker.engines.openmp import physical_cores

if TYPE_CHECKING:
    from skulk.shared.types.cards import ModelCard
    from skulk.shared.types.tasks import TextGenerationParams

logger = logging.getLogger(__name__)

COMPUTE_TYPES = {"cpu": "int8", "cuda": "float16"}
"""CTranslate2's compute type per device: int8 weights on a CPU (CTranslate2 has no float16
there; int8 is its fastest type), float16 on an NVIDIA GPU."""

WARM_UP_SECONDS = 1.0
"""Silence transcribed once at load, so the first request does not pay for CTranslate2's
lazy initialisation (about a second of decode on a small model)."""

MODEL_FILE = "model.bin"


class AudioRejected(EngineError):
    """The request's audio cannot be transcribed: its digest differs from the one the API
    node sent, or it does not decode as audio. The caller's fault: a 400."""

    error_type: ClassVar[str] = StreamErrorType.INVALID_REQUEST


class TranscriptionUnsupported(EngineError):
    """The request asks for something this model does not do (a language it lacks, a
    translation or word timings its card does not declare). A 400, never a fallback."""

    error_type: ClassVar[str] = StreamErrorType.INVALID_REQUEST


def device_of(backend: str) -> str:
    """'faster_whisper-cuda' -> 'cuda'; any other faster_whisper backend -> 'cpu'."""
    return "cuda" if backend.partition("-")[2] == "cuda" else "cpu"


def refusal(params: TranscriptionParams, card: ModelCard, languages: frozenset[str], multilingual: bool) -> str | None:
    """Why this model cannot serve `params` as asked (None: it can). Pure: the card's audio
    section and the loaded model's languages decide."""
    audio = card.audio
    if audio is None or "stt" not in card.capabilities:
        return f"{card.model_id} is not a speech-to-text model"
    if params.task == "translate" and not (audio.supports_translation and multilingual):
        return f"{card.model_id} does not translate speech (its card does not declare audio.supports_translation)"
    if params.word_timestamps and not audio.supports_word_timestamps:
        return f"{card.model_id} gives no word timestamps (its card does not declare audio.supports_word_timestamps)"
    if params.stream and not audio.supports_streaming:
        return f"{card.model_id} does not stream transcripts (its card does not declare audio.supports_streaming)"
    if params.language is not None:
        allowed = frozenset(audio.languages) & languages if audio.languages else languages
        if params.language not in allowed:
            return f"{card.model_id} does not know language {params.language!r} (it knows {', '.join(sorted(allowed))})"
    return None


def _segment(index: int, segment: Any) -> TranscriptSegment:
    words = [
        TranscriptWord(word=w.word, start=float(w.start), end=float(w.end), probability=float(w.probability))
        for w in (segment.words or ())
    ]
    return TranscriptSegment(
        id=index, start=float(segment.start), end=float(segment.end), text=segment.text, words=words,
        avg_logprob=float(segment.avg_logprob), no_speech_prob=float(segment.no_speech_prob),
        compression_ratio=float(segment.compression_ratio), temperature=float(segment.temperature or 0.0),
        tokens=list(segment.tokens),
    )


def transcript_text(segments: list[TranscriptSegment]) -> str:
    """The whole transcript: the segments' text joined, without Whisper's leading space."""
    return "".join(s.text for s in segments).strip()


class WhisperEngine:
    """faster-whisper behind the Engine protocol; serves the transcription workload only."""

    def __init__(self) -> None:
        self._model: Any = None
        self._card: ModelCard | None = None
        self._languages: frozenset[str] = frozenset()
        self._multilingual = False
        self._sampling_rate = 16000
        self._in_flight = 0
        self._lock = threading.Lock()

    @property
    def concurrency(self) -> int:
        return 1

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def load(self, spec: ShardSpec) -> None:
        from faster_whisper import WhisperModel

        backend = spec.shard.backend
        if backend_engine(backend) != "faster_whisper":
            raise ModelLoadFailed(f"shard backend {backend!r} is not a faster_whisper backend")
        if spec.shard.world_size != 1:
            raise ModelLoadFailed("a Whisper model is served by one node; it never spans several")
        path = Path(spec.model_path)
        if not (path / MODEL_FILE).is_file():
            raise ModelLoadFailed(f"no CTranslate2 Whisper model at {path} (no {MODEL_FILE})")
        device = device_of(backend)
        try:
            model = WhisperModel(str(path), device=device, compute_type=COMPUTE_TYPES[device],
                                 cpu_threads=spec.n_threads or physical_cores(), num_workers=1,
                                 local_files_only=True)
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelLoadFailed(f"faster-whisper could not load {path} on {device}: {exc}") from exc
        self._model = model
        self._card = spec.card
        self._multilingual = bool(model.model.is_multilingual)
        self._languages = frozenset(model.supported_languages)
        self._sampling_rate = int(model.feature_extractor.sampling_rate)
        logger.info("loaded %s on %s (%s, %d languages)", spec.card.model_id, device, COMPUTE_TYPES[device],
                    len(self._languages))

    def warm_up(self) -> None:
        model = self._require_loaded()
        silence = np.zeros(int(self._sampling_rate * WARM_UP_SECONDS), dtype=np.float32)
        segments, _ = model.transcribe(silence, language="en" if self._multilingual else None,
                                       temperature=0.0, without_timestamps=True)
        for _ in segments:
            pass

    def generate(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        raise WorkloadUnsupported("a Whisper model transcribes audio (/v1/audio/transcriptions); it generates no text")

    def transcribe(self, params: TranscriptionParams) -> Iterator[TranscriptionResult]:
        """The transcript of `params`' audio: one result per segment while streaming (each
        `final` false, with that segment), then the final one with every segment."""
        model = self._require_loaded()
        card = self._card
        assert card is not None
        why = refusal(params, card, self._languages, self._multilingual)
        if why is not None:
            raise TranscriptionUnsupported(why)
        try:
            data = params.audio_bytes()
        except AudioDigestMismatch as exc:
            raise AudioRejected(str(exc)) from None
        with self._lock:
            if self._in_flight:
                raise EngineBusy("a Whisper engine transcribes one request at a time")
            self._in_flight = 1
        try:
            yield from self._transcribe(model, params, data)
        finally:
            self._in_flight = 0

    def _transcribe(self, model: Any, params: TranscriptionParams, data: bytes) -> Iterator[TranscriptionResult]:
        from faster_whisper import decode_audio

        try:
            audio = np.asarray(decode_audio(io.BytesIO(data), sampling_rate=self._sampling_rate))
        except Exception as exc:  # PyAV raises many types for a file that is not audio
            raise AudioRejected(f"the file does not decode as audio ({type(exc).__name__})") from None
        if audio.size == 0:
            raise AudioRejected("the file holds no audio samples")
        segments, info = model.transcribe(
            audio,
            language=params.language if self._multilingual else None,
            task=params.task,
            initial_prompt=params.prompt or None,
            # The caller's temperature as given (no fallback ladder): the same request gives
            # the same transcript at 0.
            temperature=params.temperature,
            word_timestamps=params.word_timestamps,
        )
        language, duration = info.language, float(info.duration)
        decoded: list[TranscriptSegment] = []
        try:
            for raw in segments:
                segment = _segment(len(decoded), raw)
                decoded.append(segment)
                if params.stream:
                    yield TranscriptionResult(text=segment.text, segments=[segment], language=language,
                                              duration=duration, final=False)
        finally:
            segments.close()  # stops decoding when our caller closed us early (a cancel)
        yield TranscriptionResult(text=transcript_text(decoded), segments=decoded, language=language,
                                  duration=duration, final=True)

    def close(self) -> None:
        self._model = None
        self._card = None

    def _require_loaded(self) -> Any:
        if self._model is None:
            raise EngineNotLoaded("no Whisper model is loaded")
        return self._model


__all__ = [
    "COMPUTE_TYPES",
    "AudioRejected",
    "TranscriptionUnsupported",
    "WhisperEngine",
    "device_of",
    "refusal",
    "transcript_text",
]
