"""OpenAI's speech-to-text routes: `POST /v1/audio/transcriptions` and
`POST /v1/audio/translations` (speech in any language to English text).

A route is parse -> check -> params -> workload -> encode. The multipart form is read from
memory (`skulk.api.multipart_form`), its fields checked against the model's card
(`request_refusal`, pure: every option the card does not declare is a typed 400, never a
silent fallback), the file probed on this node (`skulk.api.audio_probe`: it must be audio,
non-empty, within the bounds), then the audio travels to the serving node inside the
request's full params on the data plane (`start_workload`); the master, State and the event
log see the params redacted. Nothing is written to disk here.

Streaming (`stream=true`, a card declaring `audio.supports_streaming`) answers OpenAI's SSE
events, one `transcript.text.delta` per decoded segment then `transcript.text.done`; a client
that goes away cancels the command (`follow_results`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from skulk.api.adapters.openai_audio import (
    MEDIA_TYPES,
    RESPONSE_FORMATS,
    STREAMED_FORMATS,
    ResponseFormat,
    delta_event,
    done_event,
    rendered,
)
from skulk.api.adapters.openai_chat import sse_error, sse_event
from skulk.api.audio_probe import probe_audio, size_refusal
from skulk.api.context import api_context
from skulk.api.errors import ApiError, InvalidRequest, ModelNotFound
from skulk.api.generation import follow_results, placed_model, start_workload
from skulk.api.multipart_form import FormPart, parse_form
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.ids import ModelId
from skulk.shared.types.workload_io import MAX_TRANSCRIPTION_PROMPT_CHARS, TranscriptionParams, TranscriptionResult

router = APIRouter()

Task = Literal["transcribe", "translate"]

FIELDS: Mapping[Task, frozenset[str]] = {
    "transcribe": frozenset({"file", "model", "language", "prompt", "response_format", "temperature",
                             "timestamp_granularities[]", "stream"}),
    "translate": frozenset({"file", "model", "prompt", "response_format", "temperature"}),
}
"""The form fields each route honours (OpenAI's, less those no Whisper engine serves:
`include[]` log probabilities, `chunking_strategy`, diarization). Any other is refused."""

GRANULARITIES = frozenset({"word", "segment"})


@dataclass(frozen=True)
class TranscriptionForm:
    """A transcription or translation request as its form said it."""

    task: Task
    file: FormPart
    model: str
    language: str | None = None
    prompt: str | None = None
    response_format: ResponseFormat = "json"
    temperature: float = 0.0
    granularities: frozenset[str] = frozenset({"segment"})
    stream: bool = False

    @property
    def words(self) -> bool:
        return "word" in self.granularities


def _one(fields: Mapping[str, list[FormPart]], name: str) -> FormPart | None:
    parts = fields.get(name)
    if not parts:
        return None
    if len(parts) > 1:
        raise InvalidRequest(f"the form gives {name!r} {len(parts)} times", param=name)
    return parts[0]


def _text(fields: Mapping[str, list[FormPart]], name: str) -> str | None:
    part = _one(fields, name)
    return None if part is None else part.text


def read_form(fields: Mapping[str, list[FormPart]], task: Task) -> TranscriptionForm:
    """The request a parsed form makes, its fields checked in themselves (400 naming the
    field); what the model supports is `request_refusal`'s."""
    unknown = sorted(set(fields) - FIELDS[task])
    if unknown:
        raise InvalidRequest(f"unsupported form field {unknown[0]!r} (this route takes {', '.join(sorted(FIELDS[task]))})",
                             param=unknown[0], code="unsupported_parameter")
    file = _one(fields, "file")
    if file is None or file.filename is None:
        raise InvalidRequest("'file' is required: the audio, uploaded as a file field", param="file")
    model = _text(fields, "model")
    if not model:
        raise InvalidRequest("'model' is required: the placed speech-to-text model", param="model")
    response_format = _text(fields, "response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise InvalidRequest(f"response_format {response_format!r} is not one of {', '.join(RESPONSE_FORMATS)}",
                             param="response_format")
    temperature_text = _text(fields, "temperature")
    try:
        temperature = 0.0 if temperature_text is None else float(temperature_text)
    except ValueError:
        raise InvalidRequest(f"temperature {temperature_text!r} is not a number", param="temperature") from None
    if not 0.0 <= temperature <= 1.0:
        raise InvalidRequest("temperature must be between 0 and 1", param="temperature")
    prompt = _text(fields, "prompt")
    if prompt is not None and len(prompt) > MAX_TRANSCRIPTION_PROMPT_CHARS:
        raise InvalidRequest(f"prompt is longer than {MAX_TRANSCRIPTION_PROMPT_CHARS} characters", param="prompt")
    stream_text = (_text(fields, "stream") or "false").strip().lower()
    if stream_text not in ("true", "false"):
        raise InvalidRequest(f"stream {stream_text!r} is not true or false", param="stream")
    granularities = frozenset(p.text for p in fields.get("timestamp_granularities[]", ()))
    if granularities - GRANULARITIES:
        raise InvalidRequest(f"timestamp_granularities[] takes {', '.join(sorted(GRANULARITIES))}",
                             param="timestamp_granularities[]")
    if granularities and response_format != "verbose_json":
        raise InvalidRequest("timestamp_granularities[] needs response_format verbose_json",
                             param="timestamp_granularities[]")
    return TranscriptionForm(task=task, file=file, model=model, language=_text(fields, "language") or None,
                             prompt=prompt or None, response_format=response_format,  # type: ignore[arg-type]
                             temperature=temperature, granularities=granularities or frozenset({"segment"}),
                             stream=stream_text == "true")


def request_refusal(form: TranscriptionForm, model_id: str, card: ModelCard,
                    languages: frozenset[str] | None) -> ApiError | None:
    """Why the model cannot serve the request as asked (None: it can). Pure: the card's
    audio section decides, and `languages` (Whisper's; None: unknown here) when the card
    names none."""
    audio = card.audio
    if audio is None or "stt" not in card.capabilities:
        return InvalidRequest(f"{model_id} is not a speech-to-text model (its card has no 'stt' capability); use a "
                              "Whisper model such as local/tiny-whisper", param="model", code="model_not_stt")
    if form.task == "translate" and not audio.supports_translation:
        return InvalidRequest(f"{model_id} does not translate speech (its card does not declare "
                              "audio.supports_translation)", param="model", code="translation_unsupported")
    if form.stream and not audio.supports_streaming:
        return InvalidRequest(f"{model_id} does not stream transcripts (its card does not declare "
                              "audio.supports_streaming)", param="stream", code="streaming_unsupported")
    if form.stream and form.response_format not in STREAMED_FORMATS:
        return InvalidRequest(f"a streamed transcript is text: response_format {' or '.join(STREAMED_FORMATS)}",
                              param="response_format")
    if form.words and not audio.supports_word_timestamps:
        return InvalidRequest(f"{model_id} gives no word timestamps (its card does not declare "
                              "audio.supports_word_timestamps)", param="timestamp_granularities[]",
                              code="word_timestamps_unsupported")
    if form.language is not None:
        known = frozenset(audio.languages) or languages
        if known is not None and form.language not in known:
            return InvalidRequest(f"language {form.language!r} is not one {model_id} knows (ISO 639-1 codes: "
                                  f"{', '.join(sorted(known))})", param="language", code="unsupported_language")
    return None


def whisper_languages() -> frozenset[str] | None:
    """The languages a multilingual Whisper knows (faster-whisper's table); None where this
    API node cannot import faster-whisper (the serving node's engine checks then)."""
    try:
        from faster_whisper.tokenizer import _LANGUAGE_CODES  # pyright: ignore[reportPrivateUsage]
    except ImportError:
        return None
    return frozenset(_LANGUAGE_CODES)


def _params(form: TranscriptionForm, model_id: str, card: ModelCard) -> TranscriptionParams:
    """The workload's params. Segment by segment whenever the card streams, even when the
    caller wants one answer: the dispatcher can only stop an engine between results, so a
    long transcription whose client left is cancelled at its next segment instead of being
    decoded to the end (the route answers from the final result)."""
    streams = form.stream or (card.audio is not None and card.audio.supports_streaming)
    return TranscriptionParams.of_audio(
        model_id, form.file.data, task=form.task, language=form.language, prompt=form.prompt, temperature=form.temperature,
        word_timestamps=form.words, stream=streams)


async def _serve(request: Request, task: Task) -> Response:
    form = read_form(parse_form(request.headers.get("content-type"), await request.body()), task)
    too_large = size_refusal(len(form.file.data))
    if too_large is not None:
        raise too_large
    context = api_context(request)
    model_id = placed_model(context, form.model)
    card = context.get_cards().get(ModelId(model_id))
    if card is None:
        raise ModelNotFound(model_id)
    refusal = request_refusal(form, model_id, card, whisper_languages())
    if refusal is not None:
        raise refusal
    await asyncio.to_thread(probe_audio, form.file.data)  # refuses what is not audio, empty or too long
    stream = await start_workload(context, _params(form, model_id, card))
    results = follow_results(request, context, stream, TranscriptionResult)
    if not form.stream:
        # The final result answers (partial ones only mark where a cancel can stop it). Read
        # to the stream's end, not just to the final result: leaving it early would cancel a
        # command that completed (the runner's terminal comes after the result).
        final: TranscriptionResult | None = None
        async with aclosing(results):
            async for result, _ in results:
                final = result
        assert final is not None and final.final  # follow_results ends on a final result or raises
        return _response(rendered(final, form.response_format, task, form.words), form.response_format)
    try:
        first = await anext(results)
    except BaseException:
        await results.aclose()
        raise
    return StreamingResponse(_events(first, results), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def _events(first: tuple[TranscriptionResult, Any],
                  results: AsyncGenerator[tuple[TranscriptionResult, Any], None]) -> AsyncGenerator[str, None]:
    """The SSE body: a delta per segment as it is decoded, then the whole text. A failure
    after the 200 is an error event the OpenAI SDK raises."""
    sent: list[str] = []

    def event(result: TranscriptionResult) -> str:
        if result.final:
            return sse_event(done_event("".join(sent) if sent else result.text))
        delta = result.text.lstrip() if not sent else result.text
        sent.append(delta)
        return sse_event(delta_event(delta))

    async with aclosing(results):
        try:
            yield event(first[0])
            async for result, _ in results:  # to the stream's end: its terminal follows the final result
                yield event(result)
        except ApiError as error:
            for line in sse_error(error):
                yield line


def _response(body: dict[str, Any] | str, response_format: ResponseFormat) -> Response:
    if isinstance(body, dict):
        return JSONResponse(body)
    return Response(content=body, media_type=MEDIA_TYPES[response_format])


@router.post("/v1/audio/transcriptions", response_model=None)
async def transcriptions(request: Request) -> Response:
    """Speech to text, OpenAI-compatible (multipart: file, model, language, prompt,
    response_format, temperature, timestamp_granularities[], stream)."""
    return await _serve(request, "transcribe")


@router.post("/v1/audio/translations", response_model=None)
async def translations(request: Request) -> Response:
    """Speech in any language to English text, for a card declaring
    audio.supports_translation (multipart: file, model, prompt, response_format, temperature)."""
    return await _serve(request, "translate")


__all__ = ["TranscriptionForm", "read_form", "request_refusal", "router"]
