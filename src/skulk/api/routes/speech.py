"""Text to speech, OpenAI's way: `POST /v1/audio/speech`, and Skulk's `GET /v1/audio/voices`
(every placed speaking model's voices, from its card).

A speech request is parse -> checks against the model's card (it speaks; the voice is one
of its voices) -> `SpeechParams` -> `start_workload` (the full params go to the serving node
on the data plane; the master sees them without the text) -> the runner's PCM, encoded here
(`skulk.api.audio_encode`) into the format asked for. When the card declares
`audio.supports_streaming`, the runner speaks sentence by sentence and each sentence's audio
leaves as soon as it is encoded: a chunked body (`stream_format` "audio", the default) or
OpenAI's server-sent events (`stream_format` "sse": `speech.audio.delta` events, then
`speech.audio.done`). FLAC is always encoded whole (its header states the length). A failure
before any audio is the caller's typed error (OpenAI's shape); a client that leaves cancels
the command, and the runner stops between sentences.

Nothing here keeps the text or the audio: both live only in this request's memory.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import math
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast, get_args

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict

from skulk.api.audio_encode import FORMATS, AudioFormat, Encoder, encode_whole, encoder, pcm_headers
from skulk.api.context import ApiContext, api_context
from skulk.api.errors import InvalidRequest, ModelNotFound, StreamFailed, openai_error_body
from skulk.api.generation import SSE_HEADERS, follow_results, placed_model, start_workload
from skulk.api.openapi_errors import OPENAI_ERROR_RESPONSES
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.common import Usage
from skulk.shared.types.ids import ModelId
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.workload_io import MAX_SPEECH_INPUT_CHARS, SpeechParams, SpeechResult

logger = logging.getLogger(__name__)

router = APIRouter(responses=OPENAI_ERROR_RESPONSES)

MIN_SPEED, MAX_SPEED = 0.25, 4.0
"""OpenAI's range for `speed` (a multiple of the voice's own pace)."""

STREAM_FORMATS = ("audio", "sse")
"""`stream_format`: the audio bytes themselves, or server-sent events carrying them."""

WHOLE_ONLY_FORMATS: frozenset[AudioFormat] = frozenset({"flac"})
"""Formats encoded whole even for a streaming card: a FLAC header states the length and
checksum, which a body sent before the end cannot know (many decoders refuse it without)."""


class VoiceRef(BaseModel):
    """OpenAI's object form of a voice (`{"id": ...}`, for its custom voices)."""

    model_config = ConfigDict(extra="ignore")

    id: str


class SpeechRequest(BaseModel):
    """`POST /v1/audio/speech`, as OpenAI documents it. Range and membership rules live in
    `speech_params`, so that each failure names its parameter the OpenAI way."""

    model_config = ConfigDict(extra="ignore")

    model: str
    input: str
    voice: str | VoiceRef | None = None
    """One of the card's `audio.voices` (by name, or as `{"id": name}`); omitted: its
    `audio.default_voice`."""
    instructions: str | None = None
    """OpenAI's style prompt for its own voices; a Piper voice takes none (refused)."""
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str = "audio"


def speaking_card(context: ApiContext, model_id: str) -> ModelCard:
    """The card of a placed model that speaks (capability 'tts'): 400 when its card says it
    does not speak (placed or not: placing it would not help), 404 when it is not placed."""
    card = context.get_cards().get(ModelId(model_id))
    if card is not None and ("tts" not in card.capabilities or card.audio is None):
        raise InvalidRequest(f"{model_id} does not speak (its model card has no 'tts' capability); use a "
                             "text-to-speech model (GET /v1/audio/voices lists the placed ones).", param="model",
                             code="model_cannot_speak")
    find = context.find_instance
    assert find is not None  # ApiContext.__post_init__ fills in the default lookup
    if card is None or find(model_id) is None:
        raise ModelNotFound(model_id)
    return card


def speech_params(body: SpeechRequest, model_id: str, card: ModelCard) -> tuple[SpeechParams, AudioFormat]:
    """The normalised request, or the first rule it breaks as a typed 400 naming its
    parameter: the input (1 to 4096 characters), the format, the speed, the stream format,
    the voice (one of the card's, which the message lists)."""
    audio = card.audio
    assert audio is not None  # speaking_card checked
    if not body.input.strip():
        raise InvalidRequest("'input' is empty: give the text to speak.", param="input")
    if len(body.input) > MAX_SPEECH_INPUT_CHARS:
        raise InvalidRequest(f"'input' is {len(body.input)} characters; at most {MAX_SPEECH_INPUT_CHARS} are spoken "
                             "in one request.", param="input", code="input_too_long")
    if body.response_format not in FORMATS:
        raise InvalidRequest(f"'response_format' {body.response_format!r} is not one of {', '.join(FORMATS)}.",
                             param="response_format")
    if not math.isfinite(body.speed) or not MIN_SPEED <= body.speed <= MAX_SPEED:
        raise InvalidRequest(f"'speed' must be between {MIN_SPEED} and {MAX_SPEED}; got {body.speed}.", param="speed")
    if body.stream_format not in STREAM_FORMATS:
        raise InvalidRequest(f"'stream_format' {body.stream_format!r} is not one of {', '.join(STREAM_FORMATS)}.",
                             param="stream_format")
    if body.stream_format == "sse" and not audio.supports_streaming:
        raise InvalidRequest(f"{model_id} does not stream speech (its card's audio.supports_streaming is false); "
                             "leave 'stream_format' as 'audio'.", param="stream_format", code="unsupported_feature")
    asked = body.voice.id if isinstance(body.voice, VoiceRef) else body.voice
    if asked is not None and asked not in audio.voices:
        raise InvalidRequest(f"{model_id} has no voice {asked!r}; its voices: {', '.join(audio.voices)}.",
                             param="voice", code="unknown_voice")
    if body.instructions:
        raise InvalidRequest(f"{model_id} takes no 'instructions' (a fixed voice has no style prompt); leave it "
                             "out.", param="instructions", code="unsupported_feature")
    response_format = cast(AudioFormat, body.response_format)
    streamed = audio.supports_streaming and response_format not in WHOLE_ONLY_FORMATS
    voice = asked if asked is not None else audio.default_voice
    return SpeechParams(model_id=ModelId(model_id), input=body.input, voice=voice, speed=body.speed,
                        stream=streamed), response_format


def _pcm_of(result: SpeechResult, sample_rate: int, command_id: str) -> bytes:
    """A result's samples, checked: its rate is the card's, its base64 whole."""
    if result.sample_rate != sample_rate:
        raise StreamFailed(StreamErrorType.PROTOCOL_VIOLATION, f"The runner spoke at {result.sample_rate} Hz for a "
                           f"{sample_rate} Hz voice (command {command_id}).", origin="api")
    try:
        return base64.b64decode(result.pcm16_b64, validate=True)
    except (binascii.Error, ValueError):
        raise StreamFailed(StreamErrorType.PROTOCOL_VIOLATION, "The runner's audio is not valid base64.",
                           origin="api") from None


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def _sse_done(usage: Usage | None) -> bytes:
    spoken = usage.prompt_tokens if usage is not None else 0
    return _sse({"type": "speech.audio.done",
                 "usage": {"input_tokens": spoken, "output_tokens": 0, "total_tokens": spoken}})


async def encoded_pieces(results: AsyncGenerator[tuple[SpeechResult, Usage | None], None], sample_rate: int,
                  command_id: str, encode: Encoder | None, response_format: AudioFormat,
                  ) -> AsyncGenerator[tuple[bytes, Usage | None], None]:
    """The encoded body, piece by piece as results arrive (`encode`), or whole once the last
    has (None): each piece with the usage so far. Encoding runs off the event loop. The
    tts@1.0.0 provider (`skulk.api.speech_providers.tts`) encodes through this too."""
    usage: Usage | None = None
    whole = bytearray()
    async with aclosing(results) as arriving:
        async for result, usage in arriving:
            pcm = _pcm_of(result, sample_rate, command_id)
            if encode is None:
                whole += pcm
                continue
            piece = await asyncio.to_thread(encode.push, pcm)
            if piece:
                yield piece, usage
    if encode is None:
        yield await asyncio.to_thread(encode_whole, response_format, bytes(whole), sample_rate), usage
        return
    rest = await asyncio.to_thread(encode.finish)
    if rest:
        yield rest, usage


@router.post("/v1/audio/speech", response_model=None)
async def speech(request: Request, body: SpeechRequest) -> Response:
    context = api_context(request)
    model_id = placed_model(context, body.model)
    card = speaking_card(context, model_id)
    params, response_format = speech_params(body, model_id, card)
    assert card.audio is not None
    rate = card.audio.sample_rate
    spec = FORMATS[response_format]
    headers = pcm_headers(rate) if response_format == "pcm" else {}
    stream = await start_workload(context, params)
    results = follow_results(request, context, stream, SpeechResult)
    encode = encoder(response_format, rate, streamed=True) if params.stream else None
    pieces = encoded_pieces(results, rate, stream.command_id, encode, response_format)
    # The first piece before the response starts: a failure before any audio (the runner
    # refused the voice, the instance went away) is an HTTP error in OpenAI's shape.
    try:
        first = await anext(pieces)
    except StopAsyncIteration:
        first = None
    except BaseException:
        await pieces.aclose()
        raise
    if not params.stream and body.stream_format == "audio":
        await pieces.aclose()
        return Response(first[0] if first else b"", media_type=spec.content_type, headers=headers)
    sse = body.stream_format == "sse"

    async def replayed() -> AsyncGenerator[tuple[bytes, Usage | None], None]:
        if first is not None:
            yield first
        async for one in pieces:
            yield one

    async def body_bytes() -> AsyncGenerator[bytes, None]:
        usage: Usage | None = None
        async with aclosing(pieces):
            try:
                async for piece, so_far in replayed():
                    usage = so_far
                    yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode()}) \
                        if sse else piece
            except StreamFailed as failure:
                # The status line has left: SSE says so in an event; a bare audio body can
                # only end short (the client sees a truncated file, and the log says why).
                logger.info("speech %s ended: %s (%s)", stream.command_id, failure.error_type, failure.message)
                if sse:
                    yield _sse({"type": "error", **openai_error_body(failure)})
                return
        if sse:
            yield _sse_done(usage)

    if sse:
        return StreamingResponse(body_bytes(), media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
    return StreamingResponse(body_bytes(), media_type=spec.content_type, headers={**SSE_HEADERS, **headers})


@router.get("/v1/audio/voices")
def voices(request: Request, model: str | None = None) -> dict[str, Any]:
    """Every placed model that speaks, with its voices and default voice, from its card
    (`model`: only that one; 404 when it is not placed, 400 when it does not speak)."""
    context = api_context(request)
    if model is not None:
        model_ids = [placed_model(context, model)]
        speaking_card(context, model_ids[0])
    else:
        model_ids = sorted({instance.model_id for instance in context.list_instances()})
    cards = context.get_cards()
    data = []
    for model_id in model_ids:
        card = cards.get(ModelId(model_id))
        if card is None or card.audio is None or "tts" not in card.capabilities:
            continue
        audio = card.audio
        data.append({"model": model_id, "voices": list(audio.voices),
                     "defaultVoice": audio.default_voice or audio.voices[0], "sampleRate": audio.sample_rate,
                     "languages": list(audio.languages), "supportsStreaming": audio.supports_streaming,
                     "responseFormats": list(get_args(AudioFormat))})
    return {"object": "list", "data": data}


__all__ = ["MAX_SPEED", "MIN_SPEED", "STREAM_FORMATS", "WHOLE_ONLY_FORMATS", "SpeechRequest", "encoded_pieces", "router",
           "speaking_card", "speech_params"]
