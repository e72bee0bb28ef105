"""The speech route's rules as a table (`skulk.api.routes.speech.speech_params`): a request
against the tiny voice's card becomes the params the runner gets, or the typed 400 naming
the parameter to fix. The route itself, on real nodes: tests/e2e/test_speech.py."""

from __future__ import annotations

import pytest

from skulk.api.errors import InvalidRequest
from skulk.api.routes.speech import SpeechRequest, speech_params
from skulk.models.cards import builtin_cards_dir, load_card

CARD = load_card(builtin_cards_dir() / "local--tiny-piper.toml")
assert CARD.audio is not None
BATCH_CARD = CARD.model_copy(update={"audio": CARD.audio.model_copy(update={"supports_streaming": False})})


def request(**fields) -> SpeechRequest:
    return SpeechRequest.model_validate({"model": CARD.model_id, "input": "Hello there.", **fields})


@pytest.mark.parametrize(("fields", "voice", "speed", "stream", "response_format"), [
    ({}, "amber", 1.0, True, "mp3"),  # OpenAI's default format; the card's default voice
    ({"voice": "cedar", "speed": 0.25}, "cedar", 0.25, True, "mp3"),
    ({"voice": {"id": "birch"}, "speed": 4.0}, "birch", 4.0, True, "mp3"),
    ({"response_format": "pcm", "stream_format": "sse"}, "amber", 1.0, True, "pcm"),
    ({"response_format": "flac"}, "amber", 1.0, False, "flac"),  # FLAC is encoded whole
    ({"instructions": ""}, "amber", 1.0, True, "mp3"),  # empty instructions ask for nothing
])
def test_a_good_request_becomes_the_runners_params(fields, voice, speed, stream, response_format):
    params, chosen = speech_params(request(**fields), CARD.model_id, CARD)
    assert (params.voice, params.speed, params.stream, chosen) == (voice, speed, stream, response_format)
    assert params.input == "Hello there." and params.model_id == CARD.model_id


def test_a_card_that_does_not_stream_is_spoken_whole():
    params, _ = speech_params(request(response_format="pcm"), CARD.model_id, BATCH_CARD)
    assert not params.stream


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"input": ""}, "input", "empty"),
    ({"input": "   "}, "input", "empty"),
    ({"input": "x" * 4097}, "input", "4097"),
    ({"response_format": "ogg"}, "response_format", "mp3, opus, aac, flac, wav, pcm"),
    ({"speed": 4.01}, "speed", "between 0.25 and 4.0"),
    ({"speed": 0.2}, "speed", "between"),
    ({"speed": float("nan")}, "speed", "between"),
    ({"stream_format": "chunks"}, "stream_format", "audio, sse"),
    ({"voice": "alloy"}, "voice", "amber, birch, cedar"),
    ({"voice": {"id": "alloy"}}, "voice", "amber, birch, cedar"),
    ({"instructions": "Whisper it."}, "instructions", "no 'instructions'"),
])
def test_a_bad_request_is_a_typed_400_naming_its_parameter(fields, param, words):
    with pytest.raises(InvalidRequest) as refused:
        speech_params(request(**fields), CARD.model_id, CARD)
    assert refused.value.param == param and words in refused.value.message


def test_sse_needs_a_card_that_streams():
    with pytest.raises(InvalidRequest) as refused:
        speech_params(request(stream_format="sse"), CARD.model_id, BATCH_CARD)
    assert refused.value.param == "stream_format" and "supports_streaming" in refused.value.message
