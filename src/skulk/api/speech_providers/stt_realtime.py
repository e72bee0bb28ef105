"""stt.realtime@1.0.0: live transcription of a PCM stream, turn by turn, as a bidirectional
capability.

The realtime edge's model (`WS /v1/realtime`) as a provider: the caller streams mono PCM16
chunks as for vad@ (the first may also name `model`, `language`, `prompt` and `turn`); the
provider runs vad@'s re-framing, Silero VAD and turn machine, emits `speech_started` /
`speech_stopped` (each stop numbered as an `item`), and commits each turn's audio (preroll
included) to the model as the route's own transcription workload, one at a time in order,
answering `{"type": "transcript", "item", "text"}` (or `transcript_failed` for that turn, and
listening goes on). A turn open at the half-close is committed there; the call ends once the
last transcript is out. Only cards declaring `audio.supports_realtime` serve it (the edge's
gate). Audio is held only for the open turn (bounded by its maximum) and its preroll.

`Held` and its functions are the pure buffer; `SttRealtimeProvider` is the shell.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from skulk.api.errors import ApiError, InvalidRequest, ModelNotFound
from skulk.api.generation import SocketChannel, follow_results, start_workload
from skulk.api.realtime import audio
from skulk.api.realtime.turns import WINDOW_MS, WINDOW_SAMPLES, TurnSettings, TurnState, step
from skulk.api.realtime.vad import VadStream
from skulk.api.speech_providers.advertising import STT_REALTIME_TAG, eligible
from skulk.api.speech_providers.bounds import MAX_PENDING_UTTERANCES
from skulk.api.speech_providers.common import ContextOf, admission_refusal, api_of, chosen_model
from skulk.api.speech_providers.errors import capability_error
from skulk.api.speech_providers.framing import FrameState, Pcm, frame
from skulk.api.speech_providers.vad import DESCRIPTOR as VAD_DESCRIPTOR
from skulk.api.speech_providers.vad import end_of_input, event_chunk, read_chunk, turn_settings
from skulk.extensions.providers.contract import CallContext
from skulk.extensions.providers.errors import CapabilityError
from skulk.shared.types.ids import ModelId
from skulk.shared.types.providers import CapabilityDescriptor
from skulk.shared.types.workload_io import MAX_TRANSCRIPTION_PROMPT_CHARS, TranscriptionParams, TranscriptionResult

CAPABILITY_ID, VERSION = STT_REALTIME_TAG.split("@")
SAMPLES_PER_MS = audio.VAD_RATE // 1000
OPTIONS = ("model", "language", "prompt")

DESCRIPTOR = CapabilityDescriptor(
    id=CAPABILITY_ID,
    version=VERSION,
    description=(
        "Realtime speech to text. Stream mono PCM16 (base64) at 8, 16, 32 or 48 kHz as input chunks; the first may "
        "name 'model' (default: the first placed realtime STT model), 'language', 'prompt' and 'turn' (as vad@). "
        "Receive speech_started / speech_stopped per turn and one transcript (or transcript_failed) per turn, "
        "numbered by 'item', in order. Half-close the input to commit an open turn and end."
    ),
    io_mode="bidi_streaming",
    input_schema={
        **VAD_DESCRIPTOR.input_schema,
        "properties": {
            **VAD_DESCRIPTOR.input_schema["properties"],  # pyright: ignore[reportGeneralTypeIssues]
            "model": {"type": "string", "minLength": 1, "maxLength": 256},
            "language": {"type": "string", "minLength": 2, "maxLength": 16},
            "prompt": {"type": "string", "maxLength": MAX_TRANSCRIPTION_PROMPT_CHARS},
        },
    },
    output_schema={
        "type": "object",
        "properties": {
            "type": {"enum": ["speech_started", "speech_stopped", "transcript", "transcript_failed"]},
            "item": {"type": "integer", "minimum": 0},
            "audioStartMs": {"type": "integer", "minimum": 0},
            "audioEndMs": {"type": "integer", "minimum": 0},
            "reason": {"enum": ["silence", "max_utterance", "end_of_input"]},
            "text": {"type": "string"},
            "code": {"type": "string"},
            "detail": {"type": "string"},
        },
        "required": ["type"],
        "additionalProperties": False,
    },
)


def _empty() -> Pcm:
    return np.zeros(0, dtype=np.int16)


@dataclass(frozen=True)
class Held:
    """The 16 kHz audio kept: from window `first_window` on."""

    first_window: int = 0
    samples: Pcm = field(default_factory=_empty)


def lookback_windows(settings: TurnSettings) -> int:
    """Windows kept outside a turn: enough for its preroll and the speech run that opens it."""
    return -(-(settings.prefix_padding_ms + settings.min_speech_ms) // WINDOW_MS) + 1


def hold(held: Held, window: Pcm, settings: TurnSettings, turn: TurnState) -> Held:
    """`held` plus the next window, less what no turn can reach back to any more."""
    samples = np.concatenate([held.samples, window])
    total = held.first_window + samples.size // WINDOW_SAMPLES
    keep_from = (turn.start_ms * SAMPLES_PER_MS // WINDOW_SAMPLES if turn.start_ms is not None
                 else total - lookback_windows(settings))
    drop = max(0, keep_from - held.first_window)
    return Held(held.first_window + drop, samples[drop * WINDOW_SAMPLES:].copy())


def cut(held: Held, start_ms: int, end_ms: int) -> Pcm:
    """The held audio between two times of the call."""
    offset = held.first_window * WINDOW_SAMPLES
    start = max(0, start_ms * SAMPLES_PER_MS - offset)
    return held.samples[start:max(start, end_ms * SAMPLES_PER_MS - offset)].copy()


@dataclass(frozen=True)
class Utterance:
    item: int
    model: str
    pcm: Pcm
    language: str | None
    prompt: str | None


_DONE = object()


class SttRealtimeProvider:
    """The stt.realtime@1.0.0 provider: vad@'s turn-taking in front of the transcription path."""

    def __init__(self, context_of: ContextOf) -> None:
        self._context_of = context_of
        self._pending: dict[str, asyncio.Queue[Utterance | None]] = {}
        self.overloaded = 0
        """Calls ended because their turns waited past `MAX_PENDING_UTTERANCES` (the drops)."""

    def descriptors(self) -> list[CapabilityDescriptor]:
        return [DESCRIPTOR]

    def admit(self, capability_id: str, ctx: CallContext) -> str | None:
        return admission_refusal(self._context_of(), "stt_realtime")

    def stats(self) -> dict[str, Any]:
        """Each open call's queue of turns waiting for their transcript, and the drops."""
        return {
            "capability": STT_REALTIME_TAG,
            "pendingTurns": [{"callId": call_id, "depth": queue.qsize(), "capacity": MAX_PENDING_UTTERANCES}
                             for call_id, queue in self._pending.items()],
            "overloaded": self.overloaded,
        }

    async def handle_stream(
        self, capability_id: str, payload: Any, inputs: AsyncIterator[Any] | None, ctx: CallContext
    ) -> AsyncIterator[dict[str, Any]]:
        assert inputs is not None  # bidirectional: the fabric hands the input stream
        out: asyncio.Queue[Any] = asyncio.Queue()
        utterances: asyncio.Queue[Utterance | None] = asyncio.Queue(MAX_PENDING_UTTERANCES)
        self._pending[ctx.call_id] = utterances
        reader = asyncio.create_task(self._listen(inputs, out, utterances))
        writer = asyncio.create_task(self._transcribe_all(utterances, out))
        try:
            while (item := await out.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._pending.pop(ctx.call_id, None)
            for task in (reader, writer):
                task.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)

    async def _listen(self, inputs: AsyncIterator[Any], out: asyncio.Queue[Any],
                      utterances: asyncio.Queue[Utterance | None]) -> None:
        try:
            await self._listen_to(inputs, out, utterances)
        except Exception as exc:  # the call ends with it (typed, or provider_failed)
            await out.put(exc)

    def _model(self, value: dict[str, Any]) -> str:
        context = api_of(self._context_of)
        try:
            model = chosen_model(context, "stt_realtime", value.get("model"))
            card = context.get_cards().get(ModelId(model))
            if card is None or context.find_instance is None or context.find_instance(model) is None:
                raise ModelNotFound(model)
            if not eligible(card, "stt_realtime"):
                raise InvalidRequest(f"{model} serves no realtime transcription (its card does not declare 'stt' "
                                     "with audio.supports_realtime)", param="model", code="model_not_realtime")
        except ApiError as error:
            raise capability_error(error) from None
        return model

    async def _listen_to(self, inputs: AsyncIterator[Any], out: asyncio.Queue[Any],
                         utterances: asyncio.Queue[Utterance | None]) -> None:
        framing: FrameState | None = None
        settings, turns, held = TurnSettings(), TurnState(), Held()
        classifier = VadStream()
        model, language, prompt, items = "", None, None, 0

        def commit(start_ms: int, end_ms: int) -> None:
            nonlocal items
            try:
                utterances.put_nowait(Utterance(items, model, cut(held, start_ms, end_ms), language, prompt))
            except asyncio.QueueFull:
                self.overloaded += 1
                raise CapabilityError("overloaded", f"{MAX_PENDING_UTTERANCES} turns wait for their transcript: "
                                      "the model does not keep up") from None
            items += 1

        async for value in inputs:
            chunk = read_chunk(value, framing.rate if framing else None, framing.samples_in if framing else 0)
            if framing is None:
                framing, settings = FrameState(chunk.rate), turn_settings(chunk.turn)
                model, language, prompt = self._model(value), value.get("language"), value.get("prompt") or None
            elif late := [name for name in OPTIONS if name in value]:
                raise CapabilityError("input_invalid", f"'{late[0]}' is taken from the first chunk only")
            framing, windows = frame(framing, chunk.pcm)
            if not windows:
                continue
            probabilities = await asyncio.to_thread(classifier.push, audio.to_float(np.concatenate(windows)))
            for window, probability in zip(windows, probabilities, strict=True):
                held = hold(held, window, settings, turns)
                turns, events = step(settings, turns, probability)
                for event in events:
                    shown = event_chunk(settings, event)
                    if event.kind == "speech_stopped":
                        await out.put({**shown, "item": items})
                        commit(event.start_ms, event.ms)
                    else:
                        await out.put(shown)
        last = end_of_input(turns)
        if last is not None:
            await out.put({**last, "item": items})
            commit(last["audioStartMs"], last["audioEndMs"])
        await utterances.put(None)

    async def _transcribe_all(self, utterances: asyncio.Queue[Utterance | None], out: asyncio.Queue[Any]) -> None:
        while (utterance := await utterances.get()) is not None:
            await out.put(await self._transcribe(utterance))
        await out.put(_DONE)

    async def _transcribe(self, utterance: Utterance) -> dict[str, Any]:
        """One turn's transcript through the transcription workload (the realtime edge's way)."""
        try:
            context = api_of(self._context_of)
            card = context.get_cards().get(ModelId(utterance.model))
            streams = bool(card is not None and card.audio is not None and card.audio.supports_streaming)
            params = TranscriptionParams.of_audio(utterance.model, audio.wav_bytes(utterance.pcm, audio.VAD_RATE),
                                                  language=utterance.language, prompt=utterance.prompt, stream=streams)
            stream = await start_workload(context, params)
            text = ""
            channel = SocketChannel(asyncio.Event())  # no socket: the call's own cancel ends the stream
            async with aclosing(follow_results(channel, context, stream, TranscriptionResult)) as results:
                async for result, _ in results:
                    if result.final:
                        text = result.text.strip()
        except (ApiError, CapabilityError) as error:
            failed = capability_error(error) if isinstance(error, ApiError) else error
            return {"type": "transcript_failed", "item": utterance.item, "code": failed.kind,
                    "detail": failed.message[:1000]}
        return {"type": "transcript", "item": utterance.item, "text": text}


__all__ = ["DESCRIPTOR", "Held", "SttRealtimeProvider", "cut", "hold", "lookback_windows"]
