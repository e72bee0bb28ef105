"""vad@'s pure rules: input chunks checked against the call, settings, turn events as chunks."""

from __future__ import annotations

import base64

import pytest

from skulk.api.realtime.turns import TurnEvent, TurnSettings, TurnState
from skulk.api.speech_providers.bounds import MAX_VAD_AUDIO_S, MAX_VAD_CHUNK_BYTES
from skulk.api.speech_providers.vad import DESCRIPTOR, end_of_input, event_chunk, read_chunk, turn_settings
from skulk.extensions.providers.errors import CapabilityError
from skulk.extensions.providers.registry import _validator, schema_problem


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("value", "rate", "samples_in", "kind"),
    [
        ({"audio": "not base64!", "sampleRate": 16000}, None, 0, "input_invalid"),
        ({"audio": _b64(b"\x00" * 3), "sampleRate": 16000}, None, 0, "input_invalid"),  # odd bytes
        ({"audio": _b64(b"\x00" * (MAX_VAD_CHUNK_BYTES + 2)), "sampleRate": 16000}, None, 0, "payload_too_large"),
        ({"audio": _b64(b"\x00" * 4), "sampleRate": 8000}, 16000, 10, "input_invalid"),  # rate changed
        ({"audio": _b64(b"\x00" * 4), "sampleRate": 16000, "turn": {}}, 16000, 10, "input_invalid"),  # late turn
        ({"audio": _b64(b"\x00" * 4), "sampleRate": 8000}, 8000, int(MAX_VAD_AUDIO_S * 8000), "payload_too_large"),
    ],
)
def test_bad_chunks_are_typed(value, rate, samples_in, kind) -> None:
    with pytest.raises(CapabilityError) as failure:
        read_chunk(value, rate, samples_in)
    assert failure.value.kind == kind


def test_a_good_chunk_is_read() -> None:
    chunk = read_chunk({"audio": _b64(b"\x01\x00\x02\x00"), "sampleRate": 48000, "turn": {"silenceMs": 300}}, None, 0)
    assert chunk.pcm.tolist() == [1, 2] and chunk.rate == 48000 and chunk.turn == {"silenceMs": 300}


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ({"audio": "", "sampleRate": 16000}, True),
        ({"audio": "", "sampleRate": 44100}, False),  # not a WebRTC rate
        ({"audio": ""}, False),
        ({"audio": "", "sampleRate": 16000, "turn": {"silenceMs": 100_000}}, False),  # hangover over its bound
        ({"audio": "", "sampleRate": 16000, "turn": {"maxUtteranceMs": 500}}, False),
        ({"audio": "", "sampleRate": 16000, "extra": 1}, False),
    ],
)
def test_the_input_schema_bounds_every_field(value, ok) -> None:
    assert (schema_problem(_validator(DESCRIPTOR.input_schema), value) is None) is ok


def test_turn_settings_default_to_the_realtime_edges() -> None:
    assert turn_settings(None) == TurnSettings()
    custom = turn_settings({"threshold": 0.6, "minSpeechMs": 64, "silenceMs": 320, "prefixPaddingMs": 100,
                            "maxUtteranceMs": 5000})
    assert custom == TurnSettings(threshold=0.6, prefix_padding_ms=100, silence_duration_ms=320, min_speech_ms=64,
                                  max_utterance_ms=5000)


@pytest.mark.parametrize(
    ("event", "chunk"),
    [
        (TurnEvent("speech_started", 700), {"type": "speech_started", "audioStartMs": 700}),
        (TurnEvent("speech_stopped", 2000, 700),
         {"type": "speech_stopped", "audioStartMs": 700, "audioEndMs": 2000, "reason": "silence"}),
        (TurnEvent("speech_stopped", 30_700, 700),
         {"type": "speech_stopped", "audioStartMs": 700, "audioEndMs": 30_700, "reason": "max_utterance"}),
    ],
)
def test_turn_events_as_chunks(event, chunk) -> None:
    assert event_chunk(TurnSettings(), event) == chunk
    assert schema_problem(_validator(DESCRIPTOR.output_schema), chunk) is None


@pytest.mark.parametrize(
    ("state", "chunk"),
    [
        (TurnState(windows=10), None),
        (TurnState(windows=100, start_ms=640),
         {"type": "speech_stopped", "audioStartMs": 640, "audioEndMs": 3200, "reason": "end_of_input"}),
    ],
)
def test_a_turn_open_at_the_half_close_is_stopped(state, chunk) -> None:
    assert end_of_input(state) == chunk
