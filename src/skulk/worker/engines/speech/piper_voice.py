"""`PiperEngine`: text to speech through Piper (piper-tts: espeak-ng phonemes, a VITS voice
exported to ONNX, run by ONNX Runtime on the CPU).

It serves the `speech` workload (`skulk.shared.types.workloads`): `synthesize(params)`
yields mono PCM16 at the voice's sample rate, one `SpeechResult` per sentence when the
request streams (the dispatcher checks for a cancel between sentences and closes the
iterator, so a cancelled request stops synthesizing), else one result holding the whole
text. The caller's voice name becomes the voice's speaker id and its speed Piper's length
scale. Encoding to MP3, Opus and the rest is the API node's business
(`skulk.api.audio_encode`), never the runner's.

It never generates text, never downloads anything (the voice is on disk before `load`) and
never keeps the text it was given.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from skulk.shared.types.cards import ModelCard
from skulk.shared.types.ids import ModelId
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.tasks import TextGenerationParams
from skulk.shared.types.workload_io import SpeechParams, SpeechResult
from skulk.worker.engines.base import (
    EngineError,
    EngineNotLoaded,
    GeneratedToken,
    ModelLoadFailed,
    ShardSpec,
    WorkloadUnsupported,
)

WARM_UP_TEXT = "Ready."
"""Spoken once after load, so the first request does not pay ONNX Runtime's first run."""

MAX_WAV_VALUE = 32767.0
"""Full scale of signed 16-bit PCM (Piper's own constant)."""


class UnknownVoice(EngineError):
    """The request names a voice the loaded model does not have. The API refuses it from the
    card first; this is the runner's own check, for a request that got past it."""

    error_type = StreamErrorType.INVALID_REQUEST


def voice_speakers(card: ModelCard, speaker_id_map: dict[str, int], num_speakers: int) -> dict[str, int | None]:
    """Each of the card's voices -> the speaker id Piper takes for it (None: a one-speaker
    voice, which takes none). Raises `ModelLoadFailed` when the card names a voice the model
    lacks: a card that promises what the model cannot say is refused at load, not per request."""
    voices = card.audio.voices if card.audio is not None else ()
    if not voices:
        raise ModelLoadFailed(f"{card.model_id}: the card names no voices (audio.voices)")
    if num_speakers <= 1:
        if len(voices) != 1:
            raise ModelLoadFailed(f"{card.model_id}: the voice has one speaker; its card names {len(voices)} voices "
                                  f"({', '.join(voices)})")
        return {voices[0]: None}
    missing = [voice for voice in voices if voice not in speaker_id_map]
    if missing:
        raise ModelLoadFailed(f"{card.model_id}: the card's voices {missing} are not speakers of the model "
                              f"(it has {sorted(speaker_id_map)})")
    return {voice: speaker_id_map[voice] for voice in voices}


def pcm16(audio: np.ndarray) -> bytes:
    """Piper's float audio in [-1, 1], peak-normalised as Piper does (`normalize_audio`),
    as signed 16-bit little-endian PCM."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    scaled = audio / peak if peak >= 1e-8 else np.zeros_like(audio)
    return np.clip(scaled * MAX_WAV_VALUE, -MAX_WAV_VALUE, MAX_WAV_VALUE).astype("<i2").tobytes()


class PiperEngine:
    """`Engine` over `piper.voice.PiperVoice`. Width 1: one request synthesizes at a time
    (ONNX Runtime already spreads one run over the node's cores)."""

    def __init__(self) -> None:
        self._voice: Any = None
        self._speakers: dict[str, int | None] = {}
        self._default_voice: str | None = None
        self._sample_rate = 0
        self._in_flight = 0
        self._lock = threading.Lock()

    @property
    def concurrency(self) -> int:
        return 1

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def sample_rate(self) -> int:
        """Hz of the PCM it returns (0 before load)."""
        return self._sample_rate

    def load(self, spec: ShardSpec) -> None:
        from piper.voice import PiperVoice

        model = Path(spec.model_path)
        if model.is_dir():
            found = sorted(model.glob("*.onnx"))
            if len(found) != 1:
                raise ModelLoadFailed(f"{spec.card.model_id}: {model} holds {len(found)} .onnx files, not one voice")
            model = found[0]
        config = Path(f"{model}.json")
        if not model.is_file() or not config.is_file():
            raise ModelLoadFailed(f"{spec.card.model_id}: a Piper voice is {model.name} with {config.name} beside it; "
                                  f"{'the config' if model.is_file() else 'the model'} is missing")
        try:
            voice = PiperVoice.load(model, config_path=config, use_cuda=False)
        except Exception as exc:  # onnxruntime and json raise many types; the runner reports one
            raise ModelLoadFailed(f"{spec.card.model_id}: Piper could not load {model.name}: {exc}") from exc
        self._speakers = voice_speakers(spec.card, dict(voice.config.speaker_id_map), voice.config.num_speakers)
        audio = spec.card.audio
        assert audio is not None  # voice_speakers refused a card without voices
        if audio.sample_rate != voice.config.sample_rate:
            raise ModelLoadFailed(f"{spec.card.model_id}: the card says {audio.sample_rate} Hz; the voice speaks at "
                                  f"{voice.config.sample_rate} Hz")
        self._default_voice = audio.default_voice or audio.voices[0]
        self._sample_rate = voice.config.sample_rate
        self._voice = voice

    def warm_up(self) -> None:
        for _ in self.synthesize(SpeechParams(model_id=ModelId("warm-up"), input=WARM_UP_TEXT)):
            pass

    def generate(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        raise WorkloadUnsupported("a Piper voice speaks text (the speech workload); it does not generate text")

    def synthesize(self, params: SpeechParams) -> Iterator[SpeechResult]:
        """The speech for `params.input`: when `params.stream`, one result per sentence in
        order (the last `final`), each synthesized only when the caller asks for it, so
        closing the iterator stops the work; else one final result with every sentence."""
        voice = self._voice
        if voice is None:
            raise EngineNotLoaded("the Piper voice is not loaded")
        name = params.voice or self._default_voice
        if name not in self._speakers:
            raise UnknownVoice(f"voice {name!r} is not one of this model's voices ({', '.join(self._speakers)})")
        from piper.config import SynthesisConfig

        config = SynthesisConfig(speaker_id=self._speakers[name], length_scale=voice.config.length_scale / params.speed)
        with self._lock:
            self._in_flight += 1
        try:
            sentences = [phonemes for phonemes in voice.phonemize(params.input) if phonemes]
            if not sentences:  # punctuation alone: nothing to say, a result of no samples
                yield SpeechResult(pcm16_b64="", sample_rate=self._sample_rate)
                return
            spoken = (pcm16(voice.phoneme_ids_to_audio(voice.phonemes_to_ids(phonemes), config))
                      for phonemes in sentences)
            if not params.stream:
                whole = b"".join(spoken)
                yield SpeechResult(pcm16_b64=base64.b64encode(whole).decode("ascii"), sample_rate=self._sample_rate)
                return
            for index, pcm in enumerate(spoken):
                yield SpeechResult(pcm16_b64=base64.b64encode(pcm).decode("ascii"), sample_rate=self._sample_rate,
                                   index=index, final=index == len(sentences) - 1)
        finally:
            with self._lock:
                self._in_flight -= 1

    def close(self) -> None:
        self._voice = None


__all__ = ["MAX_WAV_VALUE", "WARM_UP_TEXT", "PiperEngine", "UnknownVoice", "pcm16", "voice_speakers"]
