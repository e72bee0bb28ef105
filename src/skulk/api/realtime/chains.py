"""The speech chain's session update (`WS /v1/fabric/chains/speech`): one typed message
naming every participant explicitly, read into the realtime session's settings, and the
participants table that says what each named model must be.

The chain socket runs the realtime session (`skulk.api.realtime.session.Session`) and its
shell unchanged; this module only replaces how the session is configured: instead of
OpenAI's `input_audio_transcription` + Skulk's `response` extension, the client names
`stt` (required), and optionally `chat`, `tts` and its voice. It never performs I/O and
never reads the clock: cards and placements come in as plain data.

Wire shape (the first frame, and any later `session.update`, each complete)::

    {"type": "session.update", "session": {
        "stt": {"model": "...", "language": "en", "prompt": "..."},
        "chat": {"model": "...", "max_output_tokens": 256, "instructions": "..."},
        "tts": {"model": "...", "voice": "..."},
        "turn_detection": {"type": "server_vad", ...} | null}}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from skulk.api.realtime.session import (  # pyright: ignore[reportPrivateUsage]
    DEFAULT_OUTPUT_TOKENS,
    MAX_INSTRUCTIONS_CHARS,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_CHARS,
    ResponseSettings,
    SessionRefused,
    SessionSettings,
    _known,
    _object,
    _text,
    _turn_detection,
)
from skulk.api.realtime.turns import TurnSettings
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.ids import ModelId

MAX_MODEL_CHARS = 512
"""The longest model name a participant may carry (as realtime's)."""
MAX_VOICE_CHARS = 64

Role = Literal["stt", "chat", "tts"]


@dataclass(frozen=True)
class Participant:
    """What a role's model must be: a card with `capability` (and, for speech, an `audio`
    section); `realtime`: its card must declare `audio.supports_realtime`."""

    role: Role
    capability: str
    needs_audio: bool
    realtime: bool
    what: str
    """How a refusal names the kind ("a speech-to-text model")."""


PARTICIPANTS: dict[Role, Participant] = {
    "stt": Participant("stt", "stt", needs_audio=True, realtime=True, what="a speech-to-text model"),
    "chat": Participant("chat", "text", needs_audio=False, realtime=False, what="a chat model"),
    "tts": Participant("tts", "tts", needs_audio=True, realtime=False, what="a text-to-speech model"),
}
"""Each participant role and what its model must be: the one table the chain's refusals read."""


def _model(spec: Mapping[str, Any], param: str) -> str:
    model = _text(spec.get("model"), f"{param}.model", MAX_MODEL_CHARS)
    if not model:
        raise SessionRefused("missing_required_parameter", f"'{param}.model' names the placed model for this "
                             "participant.", f"{param}.model")
    return model


def chain_settings(event: object) -> SessionSettings:
    """The realtime session settings a chain's `session.update` event names; a malformed
    event, an unknown field, a missing `stt`, a `tts` without `chat`, or a bound broken is
    a `SessionRefused` naming the field."""
    fields = _object(event, "event")
    _known(fields, {"type", "event_id", "session"}, "event")
    if fields.get("type") != "session.update":
        raise SessionRefused("invalid_event", "The chain's first frame is a 'session.update' naming its "
                             "participants.", "type")
    session = _object(fields.get("session"), "session")
    _known(session, {"stt", "chat", "tts", "turn_detection"}, "session")
    if session.get("stt") is None:
        raise SessionRefused("missing_required_parameter", "'session.stt' names the speech-to-text model that "
                             "transcribes each turn.", "session.stt")
    stt = _object(session["stt"], "session.stt")
    _known(stt, {"model", "language", "prompt"}, "session.stt")
    language = _text(stt.get("language"), "session.stt.language", 3)
    if language is not None and not (2 <= len(language) <= 3 and language.isalpha() and language.islower()):
        raise SessionRefused("invalid_value", "'session.stt.language' is an ISO 639 code such as 'en'.",
                             "session.stt.language")
    response = None
    if session.get("chat") is not None:
        chat = _object(session["chat"], "session.chat")
        _known(chat, {"model", "max_output_tokens", "instructions"}, "session.chat")
        tokens = chat.get("max_output_tokens", DEFAULT_OUTPUT_TOKENS)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_OUTPUT_TOKENS:
            raise SessionRefused("invalid_value", "'session.chat.max_output_tokens' must be an integer from 1 to "
                                 f"{MAX_OUTPUT_TOKENS}.", "session.chat.max_output_tokens")
        response = ResponseSettings(model=_model(chat, "session.chat"), max_output_tokens=tokens,
                                    instructions=_text(chat.get("instructions"), "session.chat.instructions",
                                                       MAX_INSTRUCTIONS_CHARS))
    if session.get("tts") is not None:
        tts = _object(session["tts"], "session.tts")
        _known(tts, {"model", "voice"}, "session.tts")
        if response is None:
            raise SessionRefused("tts_without_chat", "'session.tts' speaks the chat model's answer; name "
                                 "'session.chat' too.", "session.tts")
        response = ResponseSettings(model=response.model, tts_model=_model(tts, "session.tts"),
                                    voice=_text(tts.get("voice"), "session.tts.voice", MAX_VOICE_CHARS),
                                    max_output_tokens=response.max_output_tokens, instructions=response.instructions)
    turn = _turn_detection(session["turn_detection"], TurnSettings(), "session.turn_detection") \
        if "turn_detection" in session else TurnSettings()
    return SessionSettings(model=_model(stt, "session.stt"), language=language,
                           prompt=_text(stt.get("prompt"), "session.stt.prompt", MAX_PROMPT_CHARS),
                           turn_detection=turn, response=response)


def chain_update(_current: SessionSettings, session: object) -> SessionSettings:
    """A later `session.update` on the chain socket: a complete composition again (the
    `Session`'s update hook)."""
    return chain_settings({"type": "session.update", "session": session})


def participants(settings: SessionSettings) -> list[tuple[Role, str, str]]:
    """The (role, model as named, param) the settings compose, in order."""
    named: list[tuple[Role, str, str]] = []
    if settings.model is not None:
        named.append(("stt", settings.model, "session.stt.model"))
    if settings.response is not None:
        named.append(("chat", settings.response.model, "session.chat.model"))
        if settings.response.tts_model is not None:
            named.append(("tts", settings.response.tts_model, "session.tts.model"))
    return named


def chain_refusal(settings: SessionSettings, cards: Mapping[ModelId, ModelCard], placed: frozenset[str],
                  resolve: Callable[[str], str]) -> SessionRefused | None:
    """Why the chain may not run on a cluster with these cards and placed models, or None.
    `resolve` maps a name as typed to the placed model it means (aliases)."""
    if settings.model is None:
        return SessionRefused("missing_required_parameter", "'session.stt' names the speech-to-text model.",
                              "session.stt")
    for role, name, param in participants(settings):
        rule = PARTICIPANTS[role]
        model = resolve(name)
        card = cards.get(ModelId(model))
        if card is None:
            return SessionRefused("model_not_found", f"{name} is not a known model.", param)
        if rule.capability not in card.capabilities or (rule.needs_audio and card.audio is None):
            return SessionRefused("model_wrong_kind", f"{name} is not {rule.what}; "
                                  f"'{param}' names {rule.what}.", param)
        if rule.realtime and (card.audio is None or not card.audio.supports_realtime):
            return SessionRefused("model_not_realtime", f"{name}'s card does not declare audio.supports_realtime, "
                                  "so it serves no realtime sessions.", param)
        if model not in placed:
            return SessionRefused("model_not_placed", f"{name} is not placed; place it first.", param)
        if role == "stt" and settings.language and card.audio is not None and card.audio.languages \
                and settings.language not in card.audio.languages:
            return SessionRefused("unsupported_language", f"{name} transcribes {', '.join(card.audio.languages)}, "
                                  f"not {settings.language}.", "session.stt.language")
        if role == "tts" and settings.response is not None and settings.response.voice is not None \
                and card.audio is not None and settings.response.voice not in card.audio.voices:
            return SessionRefused("unknown_voice", f"{name} speaks with {', '.join(card.audio.voices)}, "
                                  f"not {settings.response.voice}.", "session.tts.voice")
    return None


__all__ = ["MAX_MODEL_CHARS", "MAX_VOICE_CHARS", "PARTICIPANTS", "Participant", "Role", "chain_refusal",
           "chain_settings", "chain_update", "participants"]
