"""The realtime session (`skulk.api.realtime.session`): client events in, actions out."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from skulk.api.realtime import session as rt
from skulk.api.realtime.session import (
    CancelResponse,
    Classify,
    Respond,
    ResponseSettings,
    Send,
    Session,
    SessionRefused,
    SessionSettings,
    Transcribe,
)
from skulk.api.realtime.turns import WINDOW_MS, TurnSettings

MANUAL = SessionSettings(model="stt", turn_detection=None)
VAD = SessionSettings(model="stt", turn_detection=TurnSettings(prefix_padding_ms=64, silence_duration_ms=96,
                                                               min_speech_ms=96))


def accept(settings: SessionSettings) -> SessionRefused | None:
    return None


def only_stt(settings: SessionSettings) -> SessionRefused | None:
    if settings.model not in (None, "stt"):
        return SessionRefused("model_not_realtime", f"{settings.model} is not a realtime stt model", "session.model")
    return None


def new(settings: SessionSettings = MANUAL, check: Any = accept) -> Session:
    return Session("transcription", settings, check)


def append(ms: int, value: int = 100) -> dict[str, Any]:
    samples = np.full(ms * 24, value, dtype="<i2")
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(samples.tobytes()).decode()}


def sent(actions: list[rt.Action]) -> list[str]:
    return [a.event["type"] if isinstance(a, Send) else type(a).__name__ for a in actions]


def error_code(actions: list[rt.Action]) -> str | None:
    assert len(actions) == 1 and isinstance(actions[0], Send) and actions[0].event["type"] == "error"
    return actions[0].event["error"]["code"]


def test_opened_says_the_session() -> None:
    [created] = new().opened()
    assert isinstance(created, Send) and created.event["type"] == "transcription_session.created"
    assert created.event["session"]["input_audio_format"] == "pcm16"
    assert created.event["session"]["turn_detection"] is None


@pytest.mark.parametrize(("event", "code"), [
    ("not an object", "invalid_event"),
    ({"type": "conversation.item.create"}, "unknown_event"),
    ({"type": "input_audio_buffer.append", "audio": "@@@"}, "invalid_audio"),
    ({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}, "invalid_audio"),
    ({"type": "input_audio_buffer.append"}, "invalid_value"),
    ({"type": "input_audio_buffer.append", "audio": "A" * ((rt.MAX_APPEND_BYTES + 2) // 3 * 4 + 4)}, "audio_too_large"),
    ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty"),
    ({"type": "response.cancel"}, "response_cancel_not_active"),
    ({"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}}, "unsupported_audio_format"),
    ({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}},
     "unsupported_audio_format"),
    ({"type": "session.update", "session": {"turn_detection": {"type": "semantic_vad"}}},
     "unsupported_turn_detection"),
    ({"type": "session.update", "session": {"turn_detection": {"threshold": 2}}}, "invalid_value"),
    ({"type": "session.update", "session": {"turn_detection": {"silence_duration_ms": 1}}}, "invalid_value"),
    ({"type": "session.update", "session": {"input_audio_transcription": {"model": "chat-model"}}},
     "model_not_realtime"),
    ({"type": "session.update", "session": {"input_audio_transcription": {"language": "English"}}}, "invalid_value"),
    ({"type": "session.update", "session": {"input_audio_noise_reduction": {"type": "near_field"}}},
     "unknown_parameter"),
    ({"type": "session.update", "session": {"response": {"max_output_tokens": 10}}}, "missing_required_parameter"),
    ({"type": "session.update", "session": {"response": {"model": "m", "max_output_tokens": 4097}}}, "invalid_value"),
    ({"type": "session.update", "session": {"turn_detection": {"interrupt_response": False}}},
     "unsupported_turn_detection"),
    ({"type": "session.update", "session": {"include": ["item.input_audio_transcription.logprobs"]}},
     "unknown_parameter"),
    ({"type": "session.update", "session": {"model": "gpt-realtime"}}, "unknown_parameter"),
    ({"type": "session.update", "session": {"modalities": ["text"]}}, "unknown_parameter"),
])
def test_refusals_are_error_events_and_change_nothing(event: Any, code: str) -> None:
    session = new(check=only_stt)
    before = session.settings
    actions = session.receive(event)
    assert error_code(actions) == code
    assert session.settings == before


def test_the_error_names_the_client_event() -> None:
    [error] = new().receive({"type": "input_audio_buffer.commit", "event_id": "client_7"})
    assert isinstance(error, Send)
    assert error.event["error"]["event_id"] == "client_7" and error.event["error"]["type"] == "invalid_request_error"


def test_update_applies_beta_and_ga_shapes() -> None:
    session = new()
    [updated] = session.receive({"type": "transcription_session.update", "session": {
        "input_audio_format": "pcm16",
        "input_audio_transcription": {"model": "stt", "language": "en", "prompt": "names"},
        "turn_detection": {"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 200}}})
    assert isinstance(updated, Send) and updated.event["type"] == "transcription_session.updated"
    assert session.settings.language == "en" and session.settings.prompt == "names"
    assert session.settings.turn_detection == TurnSettings(threshold=0.6, silence_duration_ms=200)
    session.receive({"type": "session.update", "session": {"audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None}}}})
    assert session.settings.turn_detection is None
    session.receive({"type": "session.update", "session": {"response": {"model": "chat", "tts_model": "tts"}}})
    assert session.settings.response == ResponseSettings(model="chat", tts_model="tts", max_output_tokens=256)


def test_manual_commit_transcribes_the_buffer_and_links_items() -> None:
    session = new()
    assert session.receive(append(60)) == [] and session.receive(append(60)) == []
    actions = session.receive({"type": "input_audio_buffer.commit"})
    assert sent(actions) == ["input_audio_buffer.committed", "conversation.item.created", "Transcribe"]
    transcribe = actions[2]
    assert isinstance(transcribe, Transcribe) and len(transcribe.pcm) == 120 * 24 * 2
    first = transcribe.item_id
    session.receive(append(200))
    second = session.receive({"type": "input_audio_buffer.commit"})
    assert isinstance(second[0], Send) and second[0].event["previous_item_id"] == first
    assert sent(session.transcript_delta(first, "hel")) == ["conversation.item.input_audio_transcription.delta"]
    [done] = session.transcript_done(first, "hello")
    assert isinstance(done, Send) and done.event["transcript"] == "hello" and done.event["item_id"] == first


def test_clear_empties_the_buffer() -> None:
    session = new()
    session.receive(append(500))
    assert sent(session.receive({"type": "input_audio_buffer.clear"})) == ["input_audio_buffer.cleared"]
    assert error_code(session.receive({"type": "input_audio_buffer.commit"})) == "input_audio_buffer_commit_empty"


def test_pending_utterances_are_bounded() -> None:
    session = new()
    for _ in range(rt.MAX_PENDING_UTTERANCES):
        session.receive(append(200))
        assert "Transcribe" in sent(session.receive({"type": "input_audio_buffer.commit"}))
    session.receive(append(200))
    assert error_code(session.receive({"type": "input_audio_buffer.commit"})) == "too_many_pending_utterances"


def test_the_buffer_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rt, "MAX_BUFFER_BYTES", 1000 * 48)
    session = new()
    session.receive(append(900))
    assert error_code(session.receive(append(200))) == "input_audio_buffer_full"


def vad_turn(session: Session, probabilities: list[float]) -> list[rt.Action]:
    """Append as much audio as the windows cover, then report those probabilities."""
    actions = session.receive(append(len(probabilities) * WINDOW_MS))
    assert sent(actions) == ["Classify"]
    classify = actions[0]
    assert isinstance(classify, Classify) and classify.samples.size == len(probabilities) * 512
    return session.classified(probabilities)


def test_server_vad_commits_the_turn_with_its_padding() -> None:
    session = new(VAD)
    assert vad_turn(session, [0.1] * 10) == []
    actions = vad_turn(session, [0.9] * 5 + [0.1] * 3)
    assert sent(actions) == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                             "input_audio_buffer.committed", "conversation.item.created", "Transcribe"]
    started, stopped = actions[0], actions[1]
    assert isinstance(started, Send) and isinstance(stopped, Send)
    assert started.event["audio_start_ms"] == 10 * WINDOW_MS - 64
    assert stopped.event["audio_end_ms"] == 18 * WINDOW_MS
    assert started.event["item_id"] == stopped.event["item_id"]
    transcribe = actions[4]
    assert isinstance(transcribe, Transcribe)
    assert len(transcribe.pcm) == (18 * WINDOW_MS - (10 * WINDOW_MS - 64)) * 24 * 2


def test_speech_over_a_response_cancels_it() -> None:
    session = new(SessionSettings(model="stt", turn_detection=VAD.turn_detection,
                                  response=ResponseSettings(model="chat")))
    session.receive(append(200))
    [item] = [a for a in session.receive({"type": "input_audio_buffer.commit"}) if isinstance(a, Transcribe)]
    respond = session.transcript_done(item.item_id, " what time is it ")[1]
    assert isinstance(respond, Respond) and respond.transcript == "what time is it"
    actions = vad_turn(session, [0.9] * 4)
    assert sent(actions) == ["input_audio_buffer.speech_started", "CancelResponse"]
    assert actions[1] == CancelResponse(respond.response_id, "turn_detected")
    assert session.receive({"type": "response.cancel"}) == [CancelResponse(respond.response_id, "client_cancelled")]
    session.response_ended(respond.response_id)
    assert error_code(session.receive({"type": "response.cancel"})) == "response_cancel_not_active"


def test_an_empty_transcript_starts_no_response() -> None:
    session = new(SessionSettings(model="stt", turn_detection=None, response=ResponseSettings(model="chat")))
    assert sent(session.transcript_done("item_1", "  ")) == ["conversation.item.input_audio_transcription.completed"]
    assert session.response_id is None


def test_turn_times_count_from_the_session_start_when_vad_is_turned_on_later() -> None:
    session = new(MANUAL)
    session.receive(append(1000))  # a second of audio before turn detection
    session.receive({"type": "session.update", "session": {"turn_detection": {
        "type": "server_vad", "prefix_padding_ms": 64, "silence_duration_ms": 96}}})
    actions = session.receive(append(10 * WINDOW_MS))
    assert isinstance(actions[0], Classify) and actions[0].fresh  # a new VAD stream
    actions = session.classified([0.9] * 5 + [0.1] * 5)
    started = actions[0]
    assert isinstance(started, Send) and started.event["audio_start_ms"] == 1000
    stopped = actions[1]
    assert isinstance(stopped, Send) and stopped.event["audio_end_ms"] == 1000 + 8 * WINDOW_MS
    later = session.receive(append(WINDOW_MS))
    assert isinstance(later[0], Classify) and not later[0].fresh
