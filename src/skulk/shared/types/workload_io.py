"""What each one-result workload takes and gives back: its params and its result.

Text generation streams tokens (`TextGenerationParams` in, `TokenChunk`s out); every other
workload so far answers a request with one result (`ResultChunk` carries it). Their wire
types live here, each params model tagged by `workload` and each result by `workload`, so
the unions below are what every layer carries: a command (`RunWorkload`), a task
(`WorkloadTask`), a task input, a runner request and a result chunk. The table that says
how each is served and shown is `skulk.shared.types.workloads`.

A new one-result workload adds its params and result here (and one member to each union),
a row in that table, the engine method that serves it, and the engines that do
(`skulk.shared.types.engines`): nothing else in the worker, runner or API changes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Annotated, Literal

from pydantic import Field, model_validator

from skulk.shared.types.base import WireModel
from skulk.shared.types.common import FiniteFloat
from skulk.shared.types.ids import ModelId

MAX_ECHO_CHARS = 65536
"""The echo workload's bound on its text (a diagnostic, not a document reader)."""


class EmbeddingParams(WireModel):
    """A normalised embedding request: text `inputs`, or `token_inputs` (token id lists,
    embedded as given), never both. One vector per input, in order."""

    workload: Literal["embeddings"] = "embeddings"
    model_id: ModelId
    inputs: list[str] = Field(default_factory=list)
    dimensions: int | None = Field(default=None, ge=1)
    token_inputs: list[list[int]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_input_kind(self) -> EmbeddingParams:
        if bool(self.inputs) == bool(self.token_inputs):
            raise ValueError("exactly one of `inputs` or `token_inputs` (non-empty) is required")
        if any(not tokens for tokens in self.token_inputs):
            raise ValueError("every `token_inputs` item must hold at least one token id")
        return self

    @property
    def embedding_inputs(self) -> list[str] | list[list[int]]:
        """The inputs to embed, whichever kind was given."""
        return self.token_inputs or self.inputs

    def redacted(self) -> EmbeddingParams:
        """These params without the texts or token ids to embed (their count stays)."""
        return self.model_copy(update={"inputs": ["" for _ in self.inputs],
                                       "token_inputs": [[0] for _ in self.token_inputs]})


class EmbeddingResult(WireModel):
    """One vector per input, in the inputs' order."""

    workload: Literal["embeddings"] = "embeddings"
    embeddings: list[list[FiniteFloat]]


class EchoParams(WireModel):
    """The echo workload: `text` read back through the placed model's tokenizer. It proves
    the workload table end to end (a request reaches a real runner and its engine, and one
    result comes back), and shows how a model tokenizes a text."""

    workload: Literal["echo"] = "echo"
    model_id: ModelId
    text: str = Field(max_length=MAX_ECHO_CHARS)

    def redacted(self) -> EchoParams:
        """These params without the text."""
        return self.model_copy(update={"text": ""})


class EchoResult(WireModel):
    """`text` as the engine detokenizes its own `tokens` of it."""

    workload: Literal["echo"] = "echo"
    text: str
    tokens: list[int]


MAX_AUDIO_UPLOAD_BYTES = 25 * 1024 * 1024
"""The largest audio file one transcription carries (OpenAI's own upload limit). It travels
to the serving node as one data-plane message (the `task_inputs` topic admits 256 MiB), its
SHA-256 checked there before the runner hears it."""

MAX_SPEECH_INPUT_CHARS = 4096
"""The longest text one speech request synthesizes (OpenAI's own limit)."""

MAX_TRANSCRIPTION_PROMPT_CHARS = 4096


class AudioDigestMismatch(ValueError):
    """The audio that arrived is not the audio the API node sent (its SHA-256 differs)."""


class TranscriptionParams(WireModel):
    """A normalised transcription (or translation) request: the uploaded file's bytes as
    base64, and their SHA-256, which the serving node checks before the engine decodes
    them. The master sees these params redacted (no audio, no prompt); the digest stays."""

    workload: Literal["transcription"] = "transcription"
    model_id: ModelId
    audio_b64: str = Field(max_length=(MAX_AUDIO_UPLOAD_BYTES + 2) // 3 * 4)
    audio_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    task: Literal["transcribe", "translate"] = "transcribe"
    """translate: speech in any language to English text (a card with
    `audio.supports_translation`)."""
    language: str | None = Field(default=None, pattern=r"^[a-z]{2,3}$")
    prompt: str | None = Field(default=None, max_length=MAX_TRANSCRIPTION_PROMPT_CHARS)
    temperature: FiniteFloat = Field(default=0.0, ge=0.0, le=1.0)
    word_timestamps: bool = False
    stream: bool = False
    """Segment by segment as the engine decodes (a card with `audio.supports_streaming`)."""

    def audio_bytes(self) -> bytes:
        """The audio, checked against its digest (raises `AudioDigestMismatch`)."""
        try:
            data = base64.b64decode(self.audio_b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise AudioDigestMismatch(f"the audio is not valid base64: {exc}") from None
        if hashlib.sha256(data).hexdigest() != self.audio_sha256:
            raise AudioDigestMismatch("the audio's SHA-256 differs from the one the API node sent")
        return data

    @classmethod
    def of_audio(cls, model_id: str, data: bytes, **fields: object) -> TranscriptionParams:
        """Params carrying `data` with its digest."""
        return cls.model_validate({"model_id": model_id, "audio_b64": base64.b64encode(data).decode("ascii"),
                                   "audio_sha256": hashlib.sha256(data).hexdigest(), **fields})

    def redacted(self) -> TranscriptionParams:
        """These params without the audio or the prompt (the digest and duration stay)."""
        return self.model_copy(update={"audio_b64": "", "prompt": None if self.prompt is None else ""})


class TranscriptWord(WireModel):
    word: str
    start: FiniteFloat
    end: FiniteFloat
    probability: FiniteFloat | None = None


class TranscriptSegment(WireModel):
    """One decoded segment, times in seconds from the start of the audio."""

    id: int
    start: FiniteFloat
    end: FiniteFloat
    text: str
    words: list[TranscriptWord] = Field(default_factory=list)
    avg_logprob: FiniteFloat | None = None
    no_speech_prob: FiniteFloat | None = None
    compression_ratio: FiniteFloat | None = None
    temperature: FiniteFloat | None = None
    tokens: list[int] = Field(default_factory=list)


class TranscriptionResult(WireModel):
    """A transcript. Streamed, each partial result (`final` false) carries the segments
    decoded since the last and their `text`; the last (`final` true) the whole transcript."""

    workload: Literal["transcription"] = "transcription"
    text: str
    segments: list[TranscriptSegment] = Field(default_factory=list)
    language: str | None = None
    duration: FiniteFloat = 0.0
    """Seconds of audio the engine decoded."""
    final: bool = True


class SpeechParams(WireModel):
    """A normalised speech request: text in, the voice to speak it with. The runner returns
    PCM; the API node encodes the format the caller asked for."""

    workload: Literal["speech"] = "speech"
    model_id: ModelId
    input: str = Field(min_length=1, max_length=MAX_SPEECH_INPUT_CHARS)
    voice: str | None = Field(default=None, max_length=64)
    """None: the card's default voice."""
    speed: FiniteFloat = Field(default=1.0, ge=0.25, le=4.0)
    stream: bool = False
    """Sentence by sentence (a card with `audio.supports_streaming`)."""

    def redacted(self) -> SpeechParams:
        """These params without the text (a one-character stand-in keeps them valid)."""
        return self.model_copy(update={"input": "-"})


class SpeechResult(WireModel):
    """A piece of synthesized speech: mono signed 16-bit little-endian PCM at `sample_rate`,
    base64. Streamed, one result per sentence, in order (`index`); `final` on the last."""

    workload: Literal["speech"] = "speech"
    pcm16_b64: str
    sample_rate: int = Field(gt=0)
    index: int = Field(default=0, ge=0)
    final: bool = True


OneResultParams = Annotated[EmbeddingParams | EchoParams | TranscriptionParams | SpeechParams,
                            Field(discriminator="workload")]
"""The params of every workload that answers with results (one, or a few in order)."""

WorkloadResult = Annotated[EmbeddingResult | EchoResult | TranscriptionResult | SpeechResult,
                           Field(discriminator="workload")]
"""Every one-result workload's result."""

__all__ = [
    "MAX_AUDIO_UPLOAD_BYTES",
    "MAX_ECHO_CHARS",
    "MAX_SPEECH_INPUT_CHARS",
    "MAX_TRANSCRIPTION_PROMPT_CHARS",
    "AudioDigestMismatch",
    "EchoParams",
    "EchoResult",
    "EmbeddingParams",
    "EmbeddingResult",
    "OneResultParams",
    "SpeechParams",
    "SpeechResult",
    "TranscriptSegment",
    "TranscriptWord",
    "TranscriptionParams",
    "TranscriptionResult",
    "WorkloadResult",
]
