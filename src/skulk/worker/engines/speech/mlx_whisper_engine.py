"""Speech to text through mlx-whisper: a Whisper model in mlx-whisper's layout (config.json +
weights.safetensors or weights.npz), on a Mac's GPU through Metal, or on MLX's CPU backend
elsewhere (how Linux tests run it); one request at a time.

`transcribe(params)` decodes the request's audio from memory (its SHA-256 checked first, the
same PyAV decoder faster-whisper uses, no ffmpeg), hands mlx-whisper the 16 kHz samples and
yields one final result. mlx-whisper transcribes a whole file in one call, so this engine
streams no partial results (its cards declare `audio.supports_streaming` false, and a
streamed request is refused) and a cancel takes effect when that call returns.

It honours what the request asks or refuses it, typed, with the faster-whisper engine's
rules (`skulk.worker.engines.speech.whisper.refusal`): language, translation, prompt,
temperature (as given: no fallback ladder), word timestamps. Audio is never written to disk
and never logged. It must never reach the hub: the model directory is local, always.
"""

from __future__ import annotations

import io
import logging
import math
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from skulk.shared.types.cards import backend_engine
from skulk.shared.types.workload_io import (
    AudioDigestMismatch,
    TranscriptionParams,
    TranscriptionResult,
    TranscriptSegment,
    TranscriptWord,
)
from skulk.worker.engines.base import (
    EngineBusy,
    EngineNotLoaded,
    GeneratedToken,
    ModelLoadFailed,
    ShardSpec,
    WorkloadUnsupported,
)
from skulk.worker.engines.speech.whisper import AudioRejected, TranscriptionUnsupported, refusal, transcript_text

if TYPE_CHECKING:
    from skulk.shared.types.cards import ModelCard
    from skulk.shared.types.tasks import TextGenerationParams

logger = logging.getLogger(__name__)

SAMPLE_RATE = 16000
"""Whisper's input rate (mlx_whisper.audio.SAMPLE_RATE): the decoder resamples to it."""

WEIGHT_FILES = ("weights.safetensors", "weights.npz")
"""What mlx-whisper's `load_model` reads beside config.json, in its order."""

WARM_UP_SECONDS = 1.0
"""Silence transcribed once at load, so the first request does not pay for MLX's lazy
graph compilation (and a Metal kernel cache) on its first window."""

AVG_LOGPROB_FLOOR = -100.0
"""Stands for an average log probability mlx-whisper reports as NaN (a window cut at the
token limit, where its sum includes -inf): a segment that unlikely reads as such to a
client comparing against OpenAI's -1.0 threshold, and stays a JSON number."""


def uses_fp16(backend: str) -> bool:
    """'mlx_whisper-metal' (and the bare tag on a Mac) decodes in float16, mlx-whisper's
    default on the GPU; 'mlx_whisper-cpu' in float32 (MLX's CPU backend is slow in half
    precision and the tiny model's random weights overflow it)."""
    compute = backend.partition("-")[2]
    if compute:
        return compute == "metal"
    import platform

    return platform.system() == "Darwin"


def _finite(value: Any, default: float) -> float:
    """mlx-whisper reports NaN for the average log probability of a window it cut at the
    token limit; a TranscriptSegment carries JSON numbers only."""
    number = float(value)
    return number if math.isfinite(number) else default


def segments_of(raw: list[Mapping[str, Any]]) -> list[TranscriptSegment]:
    """mlx-whisper's segment dicts as transcript segments, numbered from 0. The empty ones
    (mlx-whisper blanks an instantaneous or textless segment rather than dropping it) are
    dropped, as faster-whisper never yields them. Pure."""
    out: list[TranscriptSegment] = []
    for segment in raw:
        if not str(segment.get("text", "")).strip():
            continue
        words = [
            TranscriptWord(word=str(w["word"]), start=float(w["start"]), end=float(w["end"]),
                           probability=_finite(w.get("probability", 0.0), 0.0))
            for w in segment.get("words") or ()
        ]
        out.append(TranscriptSegment(
            id=len(out), start=float(segment["start"]), end=float(segment["end"]), text=str(segment["text"]),
            words=words, avg_logprob=_finite(segment.get("avg_logprob", 0.0), AVG_LOGPROB_FLOOR),
            no_speech_prob=_finite(segment.get("no_speech_prob", 0.0), 0.0),
            compression_ratio=_finite(segment.get("compression_ratio", 0.0), 0.0),
            temperature=_finite(segment.get("temperature") or 0.0, 0.0),
            tokens=[int(t) for t in segment.get("tokens", ())],
        ))
    return out


class MlxWhisperEngine:
    """mlx-whisper behind the Engine protocol; serves the transcription workload only."""

    def __init__(self) -> None:
        self._model: Any = None
        self._path = ""
        self._fp16 = False
        self._card: ModelCard | None = None
        self._languages: frozenset[str] = frozenset()
        self._multilingual = False
        self._in_flight = 0
        self._lock = threading.Lock()

    @property
    def concurrency(self) -> int:
        return 1

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def load(self, spec: ShardSpec) -> None:
        backend = spec.shard.backend
        if backend_engine(backend) != "mlx_whisper":
            raise ModelLoadFailed(f"shard backend {backend!r} is not an mlx_whisper backend")
        if spec.shard.world_size != 1:
            raise ModelLoadFailed("a Whisper model is served by one node; it never spans several")
        path = Path(spec.model_path)
        if not (path / "config.json").is_file() or not any((path / w).is_file() for w in WEIGHT_FILES):
            raise ModelLoadFailed(f"no mlx-whisper model at {path} (config.json and {' or '.join(WEIGHT_FILES)})")
        try:
            import mlx.core as mx
            from mlx_whisper.tokenizer import LANGUAGES
            from mlx_whisper.transcribe import ModelHolder
        except ImportError as exc:
            raise ModelLoadFailed(f"mlx-whisper does not import on this node ({exc}); install it with "
                                  "`uv pip install mlx-whisper` (docs/SPEECH.md)") from exc
        fp16 = uses_fp16(backend)
        try:
            # mlx-whisper's transcribe() takes its model from this one-slot holder, keyed by
            # the path; loading through it here means transcribe() never loads (nor reaches
            # the hub: an existing path is never a repo id to it).
            model = ModelHolder.get_model(str(path), mx.float16 if fp16 else mx.float32)
            # The runner loads on its main thread and decodes on the dispatcher's. MLX binds a
            # lazy array to the stream of the thread that made it, and evaluating it on
            # another thread fails ("There is no Stream(cpu, 0) in current thread"). load_model
            # evaluates the weights only; the modules' private arrays (the encoder's sinusoid
            # positions, the decoder's causal mask, the alignment heads) are evaluated here.
            mx.eval([value for module in model.modules() for value in module.values() if isinstance(value, mx.array)])
        except (RuntimeError, ValueError, OSError, TypeError, KeyError) as exc:
            raise ModelLoadFailed(f"mlx-whisper could not load {path}: {exc}") from exc
        self._model, self._path, self._fp16, self._card = model, str(path), fp16, spec.card
        self._multilingual = bool(model.is_multilingual)
        self._languages = frozenset(list(LANGUAGES)[:model.num_languages]) if self._multilingual else frozenset({"en"})
        logger.info("loaded %s with mlx-whisper (%s, %d languages)", spec.card.model_id,
                    "float16" if fp16 else "float32", len(self._languages))

    def warm_up(self) -> None:
        self._require_loaded()
        silence = np.zeros(int(SAMPLE_RATE * WARM_UP_SECONDS), dtype=np.float32)
        self._run(silence, language="en", task="transcribe", prompt=None, temperature=0.0, word_timestamps=False)

    def generate(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        raise WorkloadUnsupported("a Whisper model transcribes audio (/v1/audio/transcriptions); it generates no text")

    def transcribe(self, params: TranscriptionParams) -> Iterator[TranscriptionResult]:
        """The transcript of `params`' audio: one final result with every segment."""
        self._require_loaded()
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
            yield self._transcribe(params, data)
        finally:
            self._in_flight = 0

    def _transcribe(self, params: TranscriptionParams, data: bytes) -> TranscriptionResult:
        from faster_whisper.audio import decode_audio  # PyAV, a dependency of every node

        try:
            audio = np.asarray(decode_audio(io.BytesIO(data), sampling_rate=SAMPLE_RATE), dtype=np.float32)
        except Exception as exc:  # PyAV raises many types for a file that is not audio
            raise AudioRejected(f"the file does not decode as audio ({type(exc).__name__})") from None
        if audio.size == 0:
            raise AudioRejected("the file holds no audio samples")
        result = self._run(audio, language=params.language if self._multilingual else "en", task=params.task,
                           prompt=params.prompt or None, temperature=params.temperature,
                           word_timestamps=params.word_timestamps)
        segments = segments_of(result["segments"])
        return TranscriptionResult(text=transcript_text(segments), segments=segments, language=str(result["language"]),
                                   duration=audio.size / SAMPLE_RATE, final=True)

    def _run(self, audio: np.ndarray, *, language: str | None, task: str, prompt: str | None, temperature: float,
             word_timestamps: bool) -> dict[str, Any]:
        from mlx_whisper import transcribe
        from mlx_whisper.transcribe import ModelHolder

        # transcribe() takes its model from this one-slot holder by path: ours, never a reload.
        ModelHolder.model, ModelHolder.model_path = self._model, self._path
        return transcribe(
            audio, path_or_hf_repo=self._path, verbose=None,
            # The caller's temperature as given (no fallback ladder): the same request gives
            # the same transcript at 0.
            temperature=temperature, initial_prompt=prompt, word_timestamps=word_timestamps,
            language=language, task=task, fp16=self._fp16,
        )

    def close(self) -> None:
        self._model = None
        self._card = None

    def _require_loaded(self) -> Any:
        if self._model is None:
            raise EngineNotLoaded("no Whisper model is loaded")
        return self._model


__all__ = ["MlxWhisperEngine", "segments_of", "uses_fp16"]
