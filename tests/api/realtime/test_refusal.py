"""What a realtime session may name (`skulk.api.routes.realtime.refusal`), against the
built-in cards: a placed `stt` card declaring `audio.supports_realtime`, a placed chat
model, a placed `tts` card and one of its voices; anything else is a typed refusal naming
the session field to fix."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from skulk.api.context import ApiContext
from skulk.api.realtime.session import ResponseSettings, SessionSettings
from skulk.api.routes.realtime import refusal, spoken_thinking
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.cards import AudioSection, ReasoningSection
from skulk.shared.types.state import State

WHISPER, PIPER, LLAMA = "local/tiny-whisper", "local/tiny-piper", "local/tiny-llama-gguf"
BATCH_WHISPER = "local/batch-whisper"


def context(placed: tuple[str, ...] = (WHISPER, PIPER, LLAMA, BATCH_WHISPER)) -> ApiContext:
    cards = {name: load_card(builtin_cards_dir() / f"{name.replace('/', '--')}.toml")
             for name in (WHISPER, PIPER, LLAMA)}
    whisper = cards[WHISPER]
    assert whisper.audio is not None
    cards[BATCH_WHISPER] = whisper.model_copy(update={
        "model_id": BATCH_WHISPER, "audio": AudioSection(**{**whisper.audio.model_dump(), "supports_realtime": False})})
    return ApiContext(node_id="n", node_name="n", get_state=State, get_cards=lambda: cards,  # pyright: ignore[reportArgumentType]
                      instance_listing=lambda: [SimpleNamespace(model_id=m) for m in placed])  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize(("settings", "placed", "code", "param"), [
    (SessionSettings(model=WHISPER), None, None, None),
    (SessionSettings(model=None), None, None, None),
    (SessionSettings(model=LLAMA), None, "model_not_stt", "session.input_audio_transcription.model"),
    (SessionSettings(model=PIPER), None, "model_not_stt", "session.input_audio_transcription.model"),
    (SessionSettings(model=BATCH_WHISPER), None, "model_not_realtime", "session.input_audio_transcription.model"),
    (SessionSettings(model=WHISPER), (LLAMA,), "model_not_found", "session.input_audio_transcription.model"),
    (SessionSettings(model=WHISPER, response=ResponseSettings(model=LLAMA, tts_model=PIPER, voice="birch")),
     None, None, None),
    (SessionSettings(model=WHISPER, response=ResponseSettings(model=WHISPER)), None, "model_not_found",
     "session.response.model"),
    (SessionSettings(model=WHISPER, response=ResponseSettings(model=LLAMA)), (WHISPER,), "model_not_found",
     "session.response.model"),
    (SessionSettings(model=WHISPER, response=ResponseSettings(model=LLAMA, tts_model=LLAMA)), None,
     "model_not_found", "session.response.tts_model"),
    (SessionSettings(model=WHISPER, response=ResponseSettings(model=LLAMA, tts_model=PIPER, voice="nobody")), None,
     "unknown_voice", "session.response.voice"),
    (SessionSettings(model=WHISPER, response=ResponseSettings(model=LLAMA, voice="birch")), None,
     "invalid_value", "session.response.voice"),
])
def test_refusal(settings: SessionSettings, placed: tuple[str, ...] | None, code: str | None,
                 param: str | None) -> None:
    refused = refusal(context() if placed is None else context(placed), settings)
    assert (None if refused is None else (refused.code, refused.param)) == (None if code is None else (code, param))


@pytest.mark.parametrize(("reasoning", "thinking"), [
    ({}, None),  # reasons not at all
    ({"format": "think_tags", "start_tag": "<think>", "end_tag": "</think>"}, None),  # always reasons
    ({"format": "think_tags", "start_tag": "<think>", "end_tag": "</think>", "switches": ["enable_thinking"]}, False),
])
def test_a_spoken_answer_turns_reasoning_off_where_it_can(reasoning: dict, thinking: bool | None) -> None:
    card = load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml")
    card = card.model_copy(update={"reasoning": ReasoningSection.model_validate(reasoning)})
    assert spoken_thinking(card) is thinking
    assert spoken_thinking(None) is None
