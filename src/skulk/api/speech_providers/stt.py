"""stt@1.0.0: the batch transcription path as a client-streaming capability.

The caller sends bounded encoded audio (any container FFmpeg reads, as the transcription
route takes) as base64 input chunks, the first optionally naming `model`, `language` and
`prompt`; its input half-close starts inference, and the one output chunk is the final
transcript. The call is the route's own path: the same card checks (`request_refusal`), the
same probe (`probe_audio`), `start_workload` + `follow_results` on a placed STT model, so a
caller leaving (or the call's deadline) cancels the core command. Audio lives only in this
call's memory and the command's data-plane params, as on the route.

`gather` is the pure input rule; `SttProvider` is the shell.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from skulk.api.audio_probe import probe_audio
from skulk.api.errors import ApiError, ModelNotFound
from skulk.api.generation import SocketChannel, follow_results, start_workload
from skulk.api.multipart_form import FormPart
from skulk.api.routes.transcriptions import TranscriptionForm, request_refusal, whisper_languages
from skulk.api.speech_providers.advertising import STT_TAG
from skulk.api.speech_providers.bounds import MAX_STT_AUDIO_BYTES, MAX_STT_CHUNK_BYTES, MAX_STT_CHUNKS, b64_chars
from skulk.api.speech_providers.common import ContextOf, admission_refusal, api_of, chosen_model
from skulk.api.speech_providers.errors import capability_error
from skulk.extensions.providers.contract import CallContext
from skulk.extensions.providers.errors import CapabilityError
from skulk.shared.types.ids import ModelId
from skulk.shared.types.providers import CapabilityDescriptor
from skulk.shared.types.workload_io import MAX_TRANSCRIPTION_PROMPT_CHARS, TranscriptionParams, TranscriptionResult

CAPABILITY_ID, VERSION = STT_TAG.split("@")

DESCRIPTOR = CapabilityDescriptor(
    id=CAPABILITY_ID,
    version=VERSION,
    description=(
        "Speech to text (batch). Send the encoded audio file (WAV, MP3, FLAC, OGG, ...) as base64 input chunks "
        f"(at most {MAX_STT_CHUNK_BYTES} bytes each, {MAX_STT_AUDIO_BYTES} in all); the first chunk may name "
        "'model' (default: the first placed speech-to-text model), 'language' (ISO 639-1) and 'prompt'. "
        "Half-close the input to start; one output chunk carries the final transcript."
    ),
    io_mode="client_streaming",
    input_schema={
        "type": "object",
        "properties": {
            "audio": {"type": "string", "maxLength": b64_chars(MAX_STT_CHUNK_BYTES)},
            "model": {"type": "string", "minLength": 1, "maxLength": 256},
            "language": {"type": "string", "minLength": 2, "maxLength": 16},
            "prompt": {"type": "string", "maxLength": MAX_TRANSCRIPTION_PROMPT_CHARS},
        },
        "required": ["audio"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "model": {"type": "string"},
            "text": {"type": "string"},
            "language": {"type": ["string", "null"]},
            "durationS": {"type": "number", "minimum": 0},
        },
        "required": ["model", "text"],
        "additionalProperties": False,
    },
)

OPTIONS = ("model", "language", "prompt")


@dataclass(frozen=True)
class Gathered:
    """The call's input so far."""

    audio: bytes = b""
    chunks: int = 0
    model: str | None = None
    language: str | None = None
    prompt: str | None = None


def gather(so_far: Gathered, value: Any) -> Gathered:
    """`so_far` plus one input chunk (schema-checked already), or the typed error: options
    only on the first chunk, the chunk and the call within their bounds, base64 audio."""
    if so_far.chunks >= MAX_STT_CHUNKS:
        raise CapabilityError("payload_too_large", f"a call takes at most {MAX_STT_CHUNKS} input chunks")
    late = [name for name in OPTIONS if name in value] if so_far.chunks else []
    if late:
        raise CapabilityError("input_invalid", f"'{late[0]}' is taken from the first chunk only")
    try:
        data = base64.b64decode(value["audio"], validate=True)
    except (binascii.Error, ValueError):
        raise CapabilityError("input_invalid", "'audio' is not valid base64") from None
    if len(data) > MAX_STT_CHUNK_BYTES:
        raise CapabilityError("payload_too_large", f"a chunk holds {len(data)} bytes; at most {MAX_STT_CHUNK_BYTES}")
    if len(so_far.audio) + len(data) > MAX_STT_AUDIO_BYTES:
        raise CapabilityError("payload_too_large", f"a call takes at most {MAX_STT_AUDIO_BYTES} bytes of audio")
    gathered = replace(so_far, audio=so_far.audio + data, chunks=so_far.chunks + 1)
    if so_far.chunks == 0:
        gathered = replace(gathered, model=value.get("model"), language=value.get("language"),
                           prompt=value.get("prompt") or None)
    return gathered


def form_of(gathered: Gathered) -> TranscriptionForm:
    """The call as the transcription route's form, so the route's card checks apply as they are."""
    return TranscriptionForm(task="transcribe", file=FormPart(name="file", data=gathered.audio, filename="audio"),
                             model=gathered.model or "", language=gathered.language, prompt=gathered.prompt)


def transcript_chunk(model: str, result: TranscriptionResult) -> dict[str, Any]:
    return {"model": model, "text": result.text.strip(), "language": result.language, "durationS": result.duration}


class SttProvider:
    """The stt@1.0.0 provider: a facade over the node's transcription path."""

    def __init__(self, context_of: ContextOf) -> None:
        self._context_of = context_of

    def descriptors(self) -> list[CapabilityDescriptor]:
        return [DESCRIPTOR]

    def admit(self, capability_id: str, ctx: CallContext) -> str | None:
        return admission_refusal(self._context_of(), "stt")

    async def handle_stream(
        self, capability_id: str, payload: Any, inputs: AsyncIterator[Any] | None, ctx: CallContext
    ) -> AsyncIterator[dict[str, Any]]:
        assert inputs is not None  # client streaming: the fabric hands the input stream
        gathered = Gathered()
        async for value in inputs:
            gathered = gather(gathered, value)
        if not gathered.audio:
            raise CapabilityError("input_invalid", "the input ended without audio")
        context = api_of(self._context_of)
        try:
            model = chosen_model(context, "stt", gathered.model)
            card = context.get_cards().get(ModelId(model))
            if card is None:
                raise ModelNotFound(model)
            refusal = request_refusal(form_of(gathered), model, card, whisper_languages())
            if refusal is not None:
                raise refusal
            await asyncio.to_thread(probe_audio, gathered.audio)  # not audio, empty, too long: typed
            streams = card.audio is not None and card.audio.supports_streaming
            params = TranscriptionParams.of_audio(model, gathered.audio, language=gathered.language,
                                                  prompt=gathered.prompt, stream=streams)
            stream = await start_workload(context, params)
            final: TranscriptionResult | None = None
            # Read to the stream's end (its terminal follows the final result); leaving early,
            # as a cancelled call does, closes the stream and cancels the command.
            channel = SocketChannel(asyncio.Event())  # no socket: the call's own cancel ends the stream
            async with aclosing(follow_results(channel, context, stream, TranscriptionResult)) as results:
                async for result, _ in results:
                    final = result
        except ApiError as error:
            raise capability_error(error) from None
        assert final is not None  # follow_results ends on a final result or raises
        yield transcript_chunk(model, final)


__all__ = ["DESCRIPTOR", "Gathered", "SttProvider", "form_of", "gather", "transcript_chunk"]
