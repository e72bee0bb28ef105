"""tts@1.0.0: the speech route's synthesis path as a server-streaming capability.

One input value (`{"input": text, "model"?, "voice"?, "speed"?}`) becomes the same
`SpeechParams` the route builds (`speaking_card` + `speech_params`: the card's voices and
ranges, typed refusals) and the same workload on a placed TTS model; the runner's PCM is
encoded to MP3 by the route's encoder (`encoded_pieces`), and each encoded piece leaves as
output chunks of at most `MAX_TTS_FRAME_BYTES`, as soon as it is encoded. Cancelling the
call (the caller's cancel, its socket closing, the deadline) closes the result stream, which
cancels the core command: the runner stops between sentences. Text and audio live only in
this call's memory.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from skulk.api.audio_encode import encoder
from skulk.api.errors import ApiError
from skulk.api.generation import SocketChannel, follow_results, start_workload
from skulk.api.routes.speech import MAX_SPEED, MIN_SPEED, SpeechRequest, encoded_pieces, speaking_card, speech_params
from skulk.api.speech_providers.advertising import TTS_TAG
from skulk.api.speech_providers.bounds import MAX_TTS_FRAME_BYTES, b64_chars
from skulk.api.speech_providers.common import ContextOf, admission_refusal, api_of, chosen_model
from skulk.api.speech_providers.errors import capability_error
from skulk.extensions.providers.contract import CallContext
from skulk.shared.types.providers import CapabilityDescriptor
from skulk.shared.types.workload_io import MAX_SPEECH_INPUT_CHARS, SpeechResult

CAPABILITY_ID, VERSION = TTS_TAG.split("@")
FORMAT = "mp3"

DESCRIPTOR = CapabilityDescriptor(
    id=CAPABILITY_ID,
    version=VERSION,
    description=(
        "Text to speech. The input names the text ('input', 1-4096 characters) and optionally 'model' (default: "
        "the first placed text-to-speech model), 'voice' (one of its card's voices) and 'speed' (0.25-4). Output "
        "chunks carry MP3 audio (base64) in order, sentence by sentence for a streaming voice; their "
        "concatenation is one MP3 stream."
    ),
    io_mode="server_streaming",
    input_schema={
        "type": "object",
        "properties": {
            "input": {"type": "string", "minLength": 1, "maxLength": MAX_SPEECH_INPUT_CHARS},
            "model": {"type": "string", "minLength": 1, "maxLength": 256},
            "voice": {"type": "string", "minLength": 1, "maxLength": 64},
            "speed": {"type": "number", "minimum": MIN_SPEED, "maximum": MAX_SPEED},
        },
        "required": ["input"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "audio": {"type": "string", "maxLength": b64_chars(MAX_TTS_FRAME_BYTES)},
            "format": {"const": FORMAT},
            "sampleRate": {"type": "integer", "minimum": 1},
        },
        "required": ["audio", "format", "sampleRate"],
        "additionalProperties": False,
    },
)


def frames_of(piece: bytes, sample_rate: int) -> list[dict[str, Any]]:
    """One encoded piece as output chunks of at most `MAX_TTS_FRAME_BYTES` each."""
    return [
        {"audio": base64.b64encode(piece[at:at + MAX_TTS_FRAME_BYTES]).decode("ascii"), "format": FORMAT,
         "sampleRate": sample_rate}
        for at in range(0, len(piece), MAX_TTS_FRAME_BYTES)
    ]


class TtsProvider:
    """The tts@1.0.0 provider: a facade over the node's speech synthesis path."""

    def __init__(self, context_of: ContextOf) -> None:
        self._context_of = context_of

    def descriptors(self) -> list[CapabilityDescriptor]:
        return [DESCRIPTOR]

    def admit(self, capability_id: str, ctx: CallContext) -> str | None:
        return admission_refusal(self._context_of(), "tts")

    async def handle_stream(
        self, capability_id: str, payload: Any, inputs: AsyncIterator[Any] | None, ctx: CallContext
    ) -> AsyncIterator[dict[str, Any]]:
        context = api_of(self._context_of)
        try:
            model = chosen_model(context, "tts", payload.get("model"))
            card = speaking_card(context, model)
            request = SpeechRequest(model=model, input=payload["input"], voice=payload.get("voice"),
                                    speed=float(payload.get("speed", 1.0)), response_format=FORMAT)
            params, _ = speech_params(request, model, card)
            assert card.audio is not None  # speaking_card checked
            rate = card.audio.sample_rate
            stream = await start_workload(context, params)
            channel = SocketChannel(asyncio.Event())  # no socket: the call's own cancel ends the stream
            results = follow_results(channel, context, stream, SpeechResult)
            pieces = encoded_pieces(results, rate, stream.command_id, encoder(FORMAT, rate, streamed=True), FORMAT)
            async with aclosing(pieces):
                async for piece, _ in pieces:
                    for chunk in frames_of(piece, rate):
                        yield chunk
        except ApiError as error:
            raise capability_error(error) from None


__all__ = ["DESCRIPTOR", "TtsProvider", "frames_of"]
