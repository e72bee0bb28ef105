"""The speech chain's session update (`skulk.api.realtime.chains`): the first frame read
into the realtime session's settings, and the participants table's refusals against the
built-in cards (a placed realtime `stt` card, a placed chat model, a placed `tts` card and
one of its voices), each naming the field to fix."""

from __future__ import annotations

from typing import Any

import pytest

from skulk.api.realtime.chains import PARTICIPANTS, chain_refusal, chain_settings, chain_update, participants
from skulk.api.realtime.session import ResponseSettings, SessionRefused, SessionSettings
from skulk.api.realtime.turns import TurnSettings
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.cards import AudioSection, ModelCard
from skulk.shared.types.ids import ModelId

WHISPER, PIPER, LLAMA = "local/tiny-whisper", "local/tiny-piper", "local/tiny-llama-gguf"
BATCH_WHISPER = "local/batch-whisper"


def update(**session: Any) -> dict[str, Any]:
    return {"type": "session.update", "session": session}


@pytest.mark.parametrize(("event", "settings"), [
    (update(stt={"model": WHISPER}), SessionSettings(model=WHISPER)),
    (update(stt={"model": WHISPER, "language": "en", "prompt": "names"}, turn_detection=None),
     SessionSettings(model=WHISPER, language="en", prompt="names", turn_detection=None)),
    (update(stt={"model": WHISPER}, turn_detection={"type": "server_vad", "silence_duration_ms": 700}),
     SessionSettings(model=WHISPER, turn_detection=TurnSettings(silence_duration_ms=700))),
    (update(stt={"model": WHISPER}, chat={"model": LLAMA, "max_output_tokens": 12, "instructions": "Be brief."}),
     SessionSettings(model=WHISPER, response=ResponseSettings(model=LLAMA, max_output_tokens=12,
                                                              instructions="Be brief."))),
    (update(stt={"model": WHISPER}, chat={"model": LLAMA}, tts={"model": PIPER, "voice": "birch"}),
     SessionSettings(model=WHISPER, response=ResponseSettings(model=LLAMA, tts_model=PIPER, voice="birch"))),
    ({"type": "session.update", "event_id": "c1", "session": {"stt": {"model": WHISPER}, "chat": None}},
     SessionSettings(model=WHISPER)),
])
def test_chain_settings(event: dict[str, Any], settings: SessionSettings) -> None:
    assert chain_settings(event) == settings


@pytest.mark.parametrize(("event", "code", "param"), [
    (None, "invalid_value", "event"),
    ({"type": "input_audio_buffer.append", "audio": ""}, "unknown_parameter", "event.audio"),
    ({"type": "input_audio_buffer.commit"}, "invalid_event", "type"),
    (update(), "missing_required_parameter", "session.stt"),
    (update(stt={}), "missing_required_parameter", "session.stt.model"),
    (update(stt=WHISPER), "invalid_value", "session.stt"),
    (update(stt={"model": WHISPER}, input_audio_transcription={"model": WHISPER}), "unknown_parameter",
     "session.input_audio_transcription"),
    (update(stt={"model": WHISPER, "temperature": 0.2}), "unknown_parameter", "session.stt.temperature"),
    (update(stt={"model": WHISPER, "language": "English"}), "invalid_value", "session.stt.language"),
    (update(stt={"model": WHISPER}, chat={"model": LLAMA, "max_output_tokens": 4097}), "invalid_value",
     "session.chat.max_output_tokens"),
    (update(stt={"model": WHISPER}, chat={"model": LLAMA, "max_output_tokens": True}), "invalid_value",
     "session.chat.max_output_tokens"),
    (update(stt={"model": WHISPER}, chat={"model": LLAMA, "tools": []}), "unknown_parameter", "session.chat.tools"),
    (update(stt={"model": WHISPER}, chat={}), "missing_required_parameter", "session.chat.model"),
    (update(stt={"model": WHISPER}, tts={"model": PIPER}), "tts_without_chat", "session.tts"),
    (update(stt={"model": WHISPER}, chat={"model": LLAMA}, tts={"voice": "birch"}), "missing_required_parameter",
     "session.tts.model"),
    (update(stt={"model": WHISPER}, chat={"model": LLAMA}, tts={"model": PIPER, "speed": 2}), "unknown_parameter",
     "session.tts.speed"),
    (update(stt={"model": WHISPER}, voice="birch"), "unknown_parameter", "session.voice"),
    (update(stt={"model": WHISPER}, turn_detection={"type": "semantic_vad"}), "unsupported_turn_detection",
     "session.turn_detection.type"),
])
def test_chain_settings_refusals(event: object, code: str, param: str) -> None:
    with pytest.raises(SessionRefused) as refused:
        chain_settings(event)
    assert (refused.value.code, refused.value.param) == (code, param)


def test_a_later_update_restates_the_whole_chain() -> None:
    before = SessionSettings(model=WHISPER, response=ResponseSettings(model=LLAMA))
    assert chain_update(before, {"stt": {"model": WHISPER}}) == SessionSettings(model=WHISPER)


def cards() -> dict[ModelId, ModelCard]:
    loaded = {ModelId(name): load_card(builtin_cards_dir() / f"{name.replace('/', '--')}.toml")
              for name in (WHISPER, PIPER, LLAMA)}
    whisper = loaded[ModelId(WHISPER)]
    assert whisper.audio is not None
    loaded[ModelId(BATCH_WHISPER)] = whisper.model_copy(update={
        "model_id": BATCH_WHISPER, "audio": AudioSection(**{**whisper.audio.model_dump(), "supports_realtime": False})})
    return loaded


ALL = (WHISPER, PIPER, LLAMA, BATCH_WHISPER)


def chain(stt: str = WHISPER, chat: str | None = None, tts: str | None = None, voice: str | None = None,
          language: str | None = None) -> SessionSettings:
    response = None if chat is None else ResponseSettings(model=chat, tts_model=tts, voice=voice)
    return SessionSettings(model=stt, language=language, response=response)


@pytest.mark.parametrize(("settings", "placed", "code", "param"), [
    (chain(), ALL, None, None),
    (chain(chat=LLAMA, tts=PIPER, voice="birch"), ALL, None, None),
    (chain(chat=LLAMA, tts=PIPER), ALL, None, None),
    (chain(language="en"), ALL, None, None),
    (chain(stt="nobody/known"), ALL, "model_not_found", "session.stt.model"),
    (chain(stt=LLAMA), ALL, "model_wrong_kind", "session.stt.model"),
    (chain(stt=PIPER), ALL, "model_wrong_kind", "session.stt.model"),
    (chain(stt=BATCH_WHISPER), ALL, "model_not_realtime", "session.stt.model"),
    (chain(), (LLAMA,), "model_not_placed", "session.stt.model"),
    (chain(chat=WHISPER), ALL, "model_wrong_kind", "session.chat.model"),
    (chain(chat=PIPER), ALL, "model_wrong_kind", "session.chat.model"),
    (chain(chat="nobody/known"), ALL, "model_not_found", "session.chat.model"),
    (chain(chat=LLAMA), (WHISPER,), "model_not_placed", "session.chat.model"),
    (chain(chat=LLAMA, tts=LLAMA), ALL, "model_wrong_kind", "session.tts.model"),
    (chain(chat=LLAMA, tts=WHISPER), ALL, "model_wrong_kind", "session.tts.model"),
    (chain(chat=LLAMA, tts=PIPER), (WHISPER, LLAMA), "model_not_placed", "session.tts.model"),
    (chain(chat=LLAMA, tts=PIPER, voice="nobody"), ALL, "unknown_voice", "session.tts.voice"),
    (SessionSettings(model=None), ALL, "missing_required_parameter", "session.stt"),
])
def test_chain_refusal(settings: SessionSettings, placed: tuple[str, ...], code: str | None,
                       param: str | None) -> None:
    refused = chain_refusal(settings, cards(), frozenset(placed), lambda name: name)
    assert (None if refused is None else (refused.code, refused.param)) == (None if code is None else (code, param))


def test_every_participant_role_has_a_row() -> None:
    named = participants(chain(chat=LLAMA, tts=PIPER))
    assert [role for role, _, _ in named] == ["stt", "chat", "tts"] == list(PARTICIPANTS)
