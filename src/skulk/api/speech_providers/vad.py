"""vad@1.0.0: voice activity detection as a bidirectional capability, with no model.

The caller streams mono PCM16 chunks (`{"audio": base64, "sampleRate": 8000 | 16000 | 32000
| 48000}`; the first may carry `turn` settings); the provider re-frames them into the
classifier's 16 kHz windows (`framing.frame`), classifies each with the realtime edge's
Silero VAD (`skulk.api.realtime.vad.VadStream`) and runs the realtime edge's turn machine
(`skulk.api.realtime.turns.step`: minimum speech, silence hangover, preroll, maximum
utterance), emitting `speech_started` / `speech_stopped` as the audio crosses them. At the
caller's half-close a turn still open is stopped (`reason` "end_of_input"). Audio lives only
in this call's memory: nothing is written, logged or kept after the call.

`read_chunk` and `turn_settings` are the pure checks; `VadProvider` is the shell.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from skulk.api.realtime import audio
from skulk.api.realtime.turns import WINDOW_MS, TurnEvent, TurnSettings, TurnState, steps
from skulk.api.realtime.vad import VadStream
from skulk.api.speech_providers.advertising import VAD_TAG
from skulk.api.speech_providers.bounds import (
    MAX_VAD_AUDIO_S,
    MAX_VAD_CHUNK_BYTES,
    MAX_VAD_MIN_SPEECH_MS,
    MAX_VAD_PREROLL_MS,
    MAX_VAD_SILENCE_MS,
    MAX_VAD_UTTERANCE_MS,
    VAD_RATES,
    b64_chars,
)
from skulk.api.speech_providers.framing import FrameState, Pcm, frame
from skulk.extensions.providers.contract import CallContext
from skulk.extensions.providers.errors import CapabilityError
from skulk.shared.types.providers import CapabilityDescriptor

CAPABILITY_ID, VERSION = VAD_TAG.split("@")

TURN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "threshold": {"type": "number", "minimum": 0.05, "maximum": 0.95},
        "minSpeechMs": {"type": "integer", "minimum": WINDOW_MS, "maximum": MAX_VAD_MIN_SPEECH_MS},
        "silenceMs": {"type": "integer", "minimum": WINDOW_MS, "maximum": MAX_VAD_SILENCE_MS},
        "prefixPaddingMs": {"type": "integer", "minimum": 0, "maximum": MAX_VAD_PREROLL_MS},
        "maxUtteranceMs": {"type": "integer", "minimum": 1000, "maximum": MAX_VAD_UTTERANCE_MS},
    },
    "additionalProperties": False,
}

DESCRIPTOR = CapabilityDescriptor(
    id=CAPABILITY_ID,
    version=VERSION,
    description=(
        "Voice activity detection. Stream mono PCM16 (base64, little-endian) at 8, 16, 32 or 48 kHz as input "
        "chunks of any length; receive speech_started and speech_stopped events (times in ms of the call's audio). "
        "The first chunk may set 'turn': threshold, minSpeechMs, silenceMs (hangover), prefixPaddingMs (preroll), "
        "maxUtteranceMs. Half-close the input to end; an open turn then stops with reason end_of_input. "
        "Audio is never retained."
    ),
    io_mode="bidi_streaming",
    input_schema={
        "type": "object",
        "properties": {
            "audio": {"type": "string", "maxLength": b64_chars(MAX_VAD_CHUNK_BYTES)},
            "sampleRate": {"enum": list(VAD_RATES)},
            "turn": TURN_SCHEMA,
        },
        "required": ["audio", "sampleRate"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "type": {"enum": ["speech_started", "speech_stopped"]},
            "audioStartMs": {"type": "integer", "minimum": 0},
            "audioEndMs": {"type": "integer", "minimum": 0},
            "reason": {"enum": ["silence", "max_utterance", "end_of_input"]},
        },
        "required": ["type", "audioStartMs"],
        "additionalProperties": False,
    },
)

StopReason = Literal["silence", "max_utterance", "end_of_input"]


def turn_settings(turn: dict[str, Any] | None) -> TurnSettings:
    """The call's turn settings: the realtime edge's defaults, overridden by `turn` (its
    ranges are the input schema's, checked before this runs)."""
    defaults = TurnSettings()
    turn = turn or {}
    return TurnSettings(
        threshold=float(turn.get("threshold", defaults.threshold)),
        prefix_padding_ms=int(turn.get("prefixPaddingMs", defaults.prefix_padding_ms)),
        silence_duration_ms=int(turn.get("silenceMs", defaults.silence_duration_ms)),
        min_speech_ms=int(turn.get("minSpeechMs", defaults.min_speech_ms)),
        max_utterance_ms=int(turn.get("maxUtteranceMs", defaults.max_utterance_ms)),
    )


@dataclass(frozen=True)
class Chunk:
    pcm: Pcm
    rate: int
    turn: dict[str, Any] | None


def read_chunk(value: Any, rate: int | None, samples_in: int) -> Chunk:
    """One input chunk, checked against the call so far (`rate`: the call's rate, None before
    the first chunk; `samples_in`: samples taken). Raises the typed error."""
    try:
        pcm_bytes = base64.b64decode(value["audio"], validate=True)
    except (binascii.Error, ValueError):
        raise CapabilityError("input_invalid", "'audio' is not valid base64") from None
    if len(pcm_bytes) % 2:
        raise CapabilityError("input_invalid", f"'audio' decodes to {len(pcm_bytes)} bytes; PCM16 samples are 2 bytes")
    if len(pcm_bytes) > MAX_VAD_CHUNK_BYTES:
        raise CapabilityError(
            "payload_too_large", f"a chunk holds {len(pcm_bytes)} bytes of PCM; at most {MAX_VAD_CHUNK_BYTES}"
        )
    chunk_rate = int(value["sampleRate"])
    if rate is not None and chunk_rate != rate:
        raise CapabilityError("input_invalid", f"'sampleRate' changed from {rate} to {chunk_rate} within the call")
    turn = value.get("turn")
    if rate is not None and turn is not None:
        raise CapabilityError("input_invalid", "'turn' settings are taken from the first chunk only")
    pcm = audio.pcm_of(pcm_bytes)
    if (samples_in + pcm.size) / chunk_rate > MAX_VAD_AUDIO_S:
        raise CapabilityError("payload_too_large", f"a call classifies at most {MAX_VAD_AUDIO_S:g} s of audio")
    return Chunk(pcm, chunk_rate, turn)


def stop_reason(settings: TurnSettings, event: TurnEvent) -> StopReason:
    return "max_utterance" if event.ms - event.start_ms >= settings.max_utterance_ms else "silence"


def event_chunk(settings: TurnSettings, event: TurnEvent) -> dict[str, Any]:
    """A turn event as the capability's output chunk."""
    if event.kind == "speech_started":
        return {"type": "speech_started", "audioStartMs": event.ms}
    return {
        "type": "speech_stopped",
        "audioStartMs": event.start_ms,
        "audioEndMs": event.ms,
        "reason": stop_reason(settings, event),
    }


def end_of_input(state: TurnState) -> dict[str, Any] | None:
    """The stop of a turn still open at the caller's half-close, or None."""
    if state.start_ms is None:
        return None
    return {
        "type": "speech_stopped",
        "audioStartMs": state.start_ms,
        "audioEndMs": state.windows * WINDOW_MS,
        "reason": "end_of_input",
    }


class VadProvider:
    """The vad@1.0.0 provider: no model, available on every API node."""

    def descriptors(self) -> list[CapabilityDescriptor]:
        return [DESCRIPTOR]

    async def handle_stream(
        self, capability_id: str, payload: Any, inputs: AsyncIterator[Any] | None, ctx: CallContext
    ) -> AsyncIterator[dict[str, Any]]:
        assert inputs is not None  # bidirectional: the fabric hands the input stream
        framing: FrameState | None = None
        settings = TurnSettings()
        turns = TurnState()
        classifier = VadStream()
        async for value in inputs:
            chunk = read_chunk(value, framing.rate if framing else None, framing.samples_in if framing else 0)
            if framing is None:
                framing = FrameState(chunk.rate)
                settings = turn_settings(chunk.turn)
            framing, windows = frame(framing, chunk.pcm)
            if not windows:
                continue
            samples = audio.to_float(np.concatenate(windows))
            probabilities = await asyncio.to_thread(classifier.push, samples)  # ONNX off the event loop
            turns, events = steps(settings, turns, probabilities)
            for event in events:
                yield event_chunk(settings, event)
        last = end_of_input(turns)
        if last is not None:
            yield last


__all__ = ["DESCRIPTOR", "VadProvider", "end_of_input", "event_chunk", "read_chunk", "turn_settings"]
