"""The OpenAI realtime dialect for transcription sessions, as a state machine: client
events in, actions out (events to send, audio to classify, utterances to transcribe,
responses to start or cancel). No I/O and no clock: the socket (`skulk.api.routes.realtime`)
performs the actions and reports back what came of them (`classified`, `transcript_*`,
`response_ended`), and ids come from the function it is given.

What it holds is the session's settings, the audio appended since the last commit (24 kHz
PCM16, at most `MAX_BUFFER_MS`; with server VAD and no turn open only the last
`prefix_padding_ms` of it), and the turn state. Bad input is an `error` event in OpenAI's
realtime shape and changes nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from skulk.api.realtime import audio, turns
from skulk.api.realtime.turns import TurnSettings, TurnState
from skulk.shared.types.workload_io import MAX_AUDIO_UPLOAD_BYTES

WAV_HEADER_BYTES = 44
MAX_BUFFER_MS = (MAX_AUDIO_UPLOAD_BYTES - WAV_HEADER_BYTES) // (audio.VAD_RATE * 2 // 1000) // 1000 * 1000
"""The most audio the input buffer holds uncommitted: what one transcription can carry
(`MAX_AUDIO_UPLOAD_BYTES` of 16 kHz WAV, 13 min 39 s; 39 MB here at 24 kHz). An append past
it is refused (commit or clear first)."""
MAX_BUFFER_BYTES = audio.samples_of(MAX_BUFFER_MS) * 2
MIN_COMMIT_MS = 100
"""The least audio a commit takes (OpenAI's own floor)."""
MAX_APPEND_BYTES = 8 * 1024 * 1024
"""The most decoded audio one append carries (about 3 minutes); its base64 (11 MiB) stays
under the 16 MiB a WebSocket frame may hold here (uvicorn's `ws_max_size`), so an oversized
append is answered with an `error` event rather than a closed socket."""
MAX_PENDING_UTTERANCES = 4
"""Committed utterances waiting for their transcript; one more commit is refused."""
MAX_OUTPUT_TOKENS = 4096
DEFAULT_OUTPUT_TOKENS = 256
MAX_INSTRUCTIONS_CHARS = 8192
MAX_PREFIX_PADDING_MS = 5_000
MIN_SILENCE_MS, MAX_SILENCE_MS = turns.WINDOW_MS, 10_000
MAX_PROMPT_CHARS = 4096

Intent = Literal["transcription", "conversation"]


class SessionRefused(ValueError):
    """A client event the session refuses: the `error` event's code, message and param."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


@dataclass(frozen=True)
class ResponseSettings:
    """The response step (a Skulk extension of the session): each final transcript goes to
    `model` (a placed chat model), and its answer, when `tts_model` is set, is spoken."""

    model: str
    tts_model: str | None = None
    voice: str | None = None
    max_output_tokens: int = DEFAULT_OUTPUT_TOKENS
    instructions: str | None = None


@dataclass(frozen=True)
class SessionSettings:
    model: str | None = None
    """The speech-to-text model (placed, `stt`, `audio.supports_realtime`)."""
    language: str | None = None
    prompt: str | None = None
    turn_detection: TurnSettings | None = TurnSettings()
    """None: the client commits; else server VAD with these settings (on by default, as
    OpenAI's is)."""
    response: ResponseSettings | None = None


# -- actions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    event: dict[str, Any]


@dataclass(frozen=True)
class Classify:
    """Run the VAD over these 16 kHz samples and report with `Session.classified`;
    `fresh`: start a new VAD stream first (turn detection was just turned on)."""

    samples: npt.NDArray[np.float32] = field(compare=False)
    fresh: bool = False


@dataclass(frozen=True)
class Transcribe:
    """Transcribe this utterance (24 kHz PCM16) for `item_id`, then report with
    `transcript_delta` / `transcript_done` / `transcript_failed`."""

    item_id: str
    pcm: bytes = field(repr=False)
    settings: SessionSettings


@dataclass(frozen=True)
class Respond:
    """Answer `transcript` with the response step; report the end with `response_ended`."""

    response_id: str
    item_id: str
    transcript: str
    settings: ResponseSettings


@dataclass(frozen=True)
class CancelResponse:
    response_id: str
    reason: Literal["turn_detected", "client_cancelled"]


Action = Send | Classify | Transcribe | Respond | CancelResponse


# -- session settings from the wire -----------------------------------------------------


def _number(value: object, param: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise SessionRefused("invalid_value", f"'{param}' must be a number from {low:g} to {high:g}.", param)
    return float(value)


def _text(value: object, param: str, max_chars: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_chars:
        raise SessionRefused("invalid_value", f"'{param}' must be a string of at most {max_chars} characters.", param)
    return value


def _object(value: object, param: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise SessionRefused("invalid_value", f"'{param}' must be an object.", param)
    return value


def _known(fields: Mapping[str, Any], known: set[str], param: str) -> None:
    for name, value in fields.items():
        if name not in known and value is not None:
            raise SessionRefused("unknown_parameter", f"'{param}.{name}' is not supported here.", f"{param}.{name}")


def _format(value: object, param: str) -> None:
    """pcm16 (beta) or {type: audio/pcm, rate: 24000} (GA); anything else is refused."""
    if value is None or value == "pcm16":
        return
    if isinstance(value, dict) and value.get("type") == "audio/pcm" and value.get("rate", audio.WIRE_RATE) == audio.WIRE_RATE:
        return
    raise SessionRefused("unsupported_audio_format", f"'{param}' must be pcm16: mono signed 16-bit little-endian PCM "
                         f"at {audio.WIRE_RATE} Hz, base64 in each append (got {value!r}).", param)


def _turn_detection(value: object, current: TurnSettings | None, param: str) -> TurnSettings | None:
    if value is None:
        return None
    fields = _object(value, param)
    _known(fields, {"type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response",
                    "interrupt_response"}, param)
    if fields.get("type", "server_vad") != "server_vad":
        raise SessionRefused("unsupported_turn_detection", f"'{param}.type' must be server_vad (or "
                             f"{param} null to commit yourself).", f"{param}.type")
    for name in ("create_response", "interrupt_response"):  # what this server always does
        if fields.get(name) is False:
            raise SessionRefused("unsupported_turn_detection", f"'{param}.{name}' false is not served: a "
                                 "configured response step answers every turn and speech interrupts it.",
                                 f"{param}.{name}")
    base = current or TurnSettings()
    settings = base
    if "threshold" in fields:
        settings = replace(settings, threshold=_number(fields["threshold"], f"{param}.threshold", 0.0, 1.0))
    if "prefix_padding_ms" in fields:
        settings = replace(settings, prefix_padding_ms=int(_number(
            fields["prefix_padding_ms"], f"{param}.prefix_padding_ms", 0, MAX_PREFIX_PADDING_MS)))
    if "silence_duration_ms" in fields:
        settings = replace(settings, silence_duration_ms=int(_number(
            fields["silence_duration_ms"], f"{param}.silence_duration_ms", MIN_SILENCE_MS, MAX_SILENCE_MS)))
    return settings


def _response(value: object, param: str) -> ResponseSettings | None:
    if value is None:
        return None
    fields = _object(value, param)
    _known(fields, {"model", "tts_model", "voice", "max_output_tokens", "instructions"}, param)
    model = _text(fields.get("model"), f"{param}.model", 512)
    if not model:
        raise SessionRefused("missing_required_parameter", f"'{param}.model' names the placed chat model that "
                             "answers each transcript.", f"{param}.model")
    tokens = fields.get("max_output_tokens", DEFAULT_OUTPUT_TOKENS)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_OUTPUT_TOKENS:
        raise SessionRefused("invalid_value", f"'{param}.max_output_tokens' must be an integer from 1 to "
                             f"{MAX_OUTPUT_TOKENS}.", f"{param}.max_output_tokens")
    return ResponseSettings(model=model, tts_model=_text(fields.get("tts_model"), f"{param}.tts_model", 512),
                            voice=_text(fields.get("voice"), f"{param}.voice", 64), max_output_tokens=tokens,
                            instructions=_text(fields.get("instructions"), f"{param}.instructions",
                                               MAX_INSTRUCTIONS_CHARS))


def updated_settings(settings: SessionSettings, session: object) -> SessionSettings:
    """`settings` with a `session.update` / `transcription_session.update` event's `session`
    applied (fields it leaves out keep their value). Beta (`input_audio_format`,
    `input_audio_transcription`, `turn_detection`) and GA (`audio.input.format`,
    `.transcription`, `.turn_detection`) shapes are both read."""
    fields = _object(session, "session")
    _known(fields, {"type", "object", "id", "input_audio_format", "input_audio_transcription", "turn_detection",
                    "audio", "response"}, "session")
    if fields.get("include"):
        raise SessionRefused("unknown_parameter", "'session.include' (logprobs) is not served.", "session.include")
    transcription_param, turn_param = "session.input_audio_transcription", "session.turn_detection"
    transcription, turn = fields.get("input_audio_transcription"), fields.get("turn_detection", ...)
    _format(fields.get("input_audio_format"), "session.input_audio_format")
    if "audio" in fields:
        audio_in = _object(_object(fields["audio"], "session.audio").get("input") or {}, "session.audio.input")
        _known(audio_in, {"format", "transcription", "turn_detection", "noise_reduction"}, "session.audio.input")
        _format(audio_in.get("format"), "session.audio.input.format")
        if "transcription" in audio_in:
            transcription, transcription_param = audio_in["transcription"], "session.audio.input.transcription"
        if "turn_detection" in audio_in:
            turn, turn_param = audio_in["turn_detection"], "session.audio.input.turn_detection"
    if transcription is not None:
        spec = _object(transcription, transcription_param)
        _known(spec, {"model", "language", "prompt"}, transcription_param)
        language = _text(spec.get("language"), f"{transcription_param}.language", 3)
        if language is not None and not (2 <= len(language) <= 3 and language.isalpha() and language.islower()):
            raise SessionRefused("invalid_value", f"'{transcription_param}.language' is an ISO 639 code "
                                 "such as 'en'.", f"{transcription_param}.language")
        settings = replace(settings, model=_text(spec.get("model"), f"{transcription_param}.model", 512)
                           or settings.model, language=language,
                           prompt=_text(spec.get("prompt"), f"{transcription_param}.prompt", MAX_PROMPT_CHARS))
    if turn is not ...:
        settings = replace(settings, turn_detection=_turn_detection(turn, settings.turn_detection, turn_param))
    if "response" in fields:
        settings = replace(settings, response=_response(fields["response"], "session.response"))
    return settings


def session_object(session_id: str, intent: Intent, settings: SessionSettings) -> dict[str, Any]:
    """The `session` of a created / updated event, in both shapes (beta's flat fields, GA's
    `type` and `audio.input`), so either SDK reads it."""
    turn = settings.turn_detection
    response = settings.response
    transcription = {"model": settings.model, "language": settings.language, "prompt": settings.prompt}
    turn_detection = None if turn is None else {
        "type": "server_vad", "threshold": turn.threshold, "prefix_padding_ms": turn.prefix_padding_ms,
        "silence_duration_ms": turn.silence_duration_ms}
    return {
        "id": session_id,
        "object": "realtime.transcription_session" if intent == "transcription" else "realtime.session",
        "type": "transcription" if intent == "transcription" else "realtime",
        "input_audio_format": "pcm16",
        "input_audio_transcription": transcription,
        "turn_detection": turn_detection,
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": audio.WIRE_RATE},
                            "transcription": transcription, "turn_detection": turn_detection}},
        "response": None if response is None else {
            "model": response.model, "tts_model": response.tts_model, "voice": response.voice,
            "max_output_tokens": response.max_output_tokens, "instructions": response.instructions},
    }


def error_event(event_id: str, code: str, message: str, param: str | None = None,
                client_event_id: str | None = None, error_type: str = "invalid_request_error") -> dict[str, Any]:
    """An `error` event in OpenAI's realtime shape."""
    return {"type": "error", "event_id": event_id, "error": {"type": error_type, "code": code, "message": message,
                                                            "param": param, "event_id": client_event_id}}


# -- the session ------------------------------------------------------------------------


class Session:
    """One socket's session. `receive(event)` takes a parsed client event; the others are
    the socket reporting what its actions came to. Each returns the actions to perform, in
    order."""

    def __init__(self, intent: Intent, settings: SessionSettings,
                 check: Callable[[SessionSettings], SessionRefused | None],
                 new_id: Callable[[str], str] | None = None, *, beta: bool = True,
                 parse_update: Callable[[SessionSettings, object], SessionSettings] | None = None) -> None:
        """`beta`: the client speaks the beta dialect (it sent `OpenAI-Beta: realtime=v1`): a
        transcription session opens with `transcription_session.created`, as beta's did; a GA
        client gets `session.created` (GA has no transcription_session events). Updates are
        answered in the dialect of the update. `parse_update`: how a `session.update`'s
        `session` changes the settings (`updated_settings`, OpenAI's shape, by default; the
        speech chain names its participants instead, `skulk.api.realtime.chains`)."""
        counter = itertools.count(1)
        self._new_id = new_id or (lambda prefix: f"{prefix}_{next(counter)}")
        self.intent: Intent = intent
        self.beta = beta
        self.settings = settings
        self._check = check
        self._parse_update = parse_update or updated_settings
        self.session_id = self._new_id("sess")
        self._buffer = bytearray()
        self._buffer_start = 0
        """Absolute 24 kHz sample index of the buffer's first sample."""
        self._appended = 0
        """24 kHz samples appended this session."""
        self._carry: audio.Pcm = np.zeros(0, dtype=np.int16)
        self._turn = TurnState()
        self._vad_origin = 0
        """Absolute 24 kHz sample index where the VAD's windows start (turn times count from
        it): where turn detection was last turned on."""
        self._vad_fresh = False
        self._turn_item: str | None = None
        self._last_item: str | None = None
        self._pending = 0
        self.response_id: str | None = None
        """The response in flight, if any."""

    # events -----------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> Send:
        return Send({"type": kind, "event_id": self._new_id("event"), **fields})

    def _error(self, refused: SessionRefused, client_event_id: str | None) -> Send:
        return Send(error_event(self._new_id("event"), refused.code, refused.message, refused.param, client_event_id))

    def opened(self) -> list[Action]:
        """The first event (the session as it starts)."""
        refused = self._check(self.settings)
        kind = "transcription_session.created" if self.intent == "transcription" and self.beta else "session.created"
        actions: list[Action] = [self._event(kind, session=session_object(self.session_id, self.intent, self.settings))]
        if refused is not None:
            actions.append(self._error(refused, None))
        return actions

    def receive(self, event: object) -> list[Action]:
        client_id = event.get("event_id") if isinstance(event, dict) else None
        client_id = client_id if isinstance(client_id, str) else None
        try:
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise SessionRefused("invalid_event", "Each frame is a JSON object with a string 'type'.", "type")
            handler = _HANDLERS.get(event["type"])
            if handler is None:
                raise SessionRefused("unknown_event", f"Unknown or unsupported event type {event['type']!r}; this "
                                     f"server takes {', '.join(sorted(_HANDLERS))}.", "type")
            return handler(self, event)
        except SessionRefused as refused:
            return [self._error(refused, client_id)]

    def _update(self, event: dict[str, Any]) -> list[Action]:
        settings = self._parse_update(self.settings, event.get("session", {}))
        if (refused := self._check(settings)) is not None:
            raise refused
        if settings.turn_detection is not None and self.settings.turn_detection is None:
            self._turn, self._vad_origin, self._vad_fresh = TurnState(), self._appended, True
            self._carry = np.zeros(0, dtype=np.int16)
            self._turn_item = None
        elif settings.turn_detection != self.settings.turn_detection:
            self._turn = TurnState(windows=self._turn.windows)
            self._turn_item = None
        self.settings = settings
        kind = f"{event['type']}d"  # session.update -> session.updated, transcription_session.update -> ...updated
        return [self._event(kind, session=session_object(self.session_id, self.intent, settings))]

    def _append(self, event: dict[str, Any]) -> list[Action]:
        encoded = event.get("audio")
        if not isinstance(encoded, str):
            raise SessionRefused("invalid_value", "'audio' is base64 PCM16 (24 kHz mono).", "audio")
        if len(encoded) > (MAX_APPEND_BYTES + 2) // 3 * 4:
            raise SessionRefused("audio_too_large", f"One append carries at most {MAX_APPEND_BYTES} bytes of audio; "
                                 "send it in smaller pieces.", "audio")
        try:
            data = audio.decode_pcm16(encoded)
        except audio.BadAudio as bad:
            raise SessionRefused("invalid_audio", f"{bad}.", "audio") from None
        if len(self._buffer) + len(data) > MAX_BUFFER_BYTES:
            raise SessionRefused("input_audio_buffer_full", f"The input buffer holds at most "
                                 f"{MAX_BUFFER_MS // 1000} s of audio; commit or clear it first.", "audio")
        self._buffer.extend(data)
        samples = audio.pcm_of(data)
        self._appended += samples.size
        if self.settings.turn_detection is None:
            return []
        out, self._carry = audio.downsample_24k_to_16k(self._carry, samples)
        if not out.size:
            return []
        fresh, self._vad_fresh = self._vad_fresh, False
        return [Classify(audio.to_float(out), fresh)]

    def classified(self, probabilities: list[float]) -> list[Action]:
        """The VAD's probabilities for the windows of the last `Classify`."""
        turn = self.settings.turn_detection
        if turn is None:
            return []
        actions: list[Action] = []
        for probability in probabilities:
            self._turn, events = turns.step(turn, self._turn, probability)
            for happened in events:
                at = self._vad_origin + audio.samples_of(happened.ms)
                if happened.kind == "speech_started":
                    self._turn_item = self._new_id("item")
                    actions.append(self._event("input_audio_buffer.speech_started", audio_start_ms=audio.ms_of(at),
                                               item_id=self._turn_item))
                    if self.response_id is not None:
                        actions.append(CancelResponse(self.response_id, "turn_detected"))
                else:
                    item = self._turn_item or self._new_id("item")
                    self._turn_item = None
                    actions.append(self._event("input_audio_buffer.speech_stopped", audio_end_ms=audio.ms_of(at),
                                               item_id=item))
                    start = self._vad_origin + audio.samples_of(happened.start_ms)
                    actions.extend(self._commit_span(item, start, at))
        if self._turn.start_ms is None:
            self._trim(turn.prefix_padding_ms)
        return actions

    def _trim(self, keep_ms: int) -> None:
        """Outside a turn, only the last `keep_ms` of audio can become part of one."""
        keep = audio.samples_of(keep_ms) * 2
        if len(self._buffer) > keep:
            drop = len(self._buffer) - keep
            del self._buffer[:drop]
            self._buffer_start += drop // 2

    def _commit_span(self, item_id: str, start: int, end: int) -> list[Action]:
        """Commit the buffer's audio from absolute sample `start` to `end`; what came before
        it is dropped, what came after stays."""
        first = max(0, start - self._buffer_start) * 2
        last = max(first, min(len(self._buffer), (end - self._buffer_start) * 2))
        pcm = bytes(self._buffer[first:last])
        del self._buffer[:last]
        self._buffer_start += last // 2
        return self._committed(item_id, pcm, None)

    def _committed(self, item_id: str, pcm: bytes, client_id: str | None) -> list[Action]:
        if self._pending >= MAX_PENDING_UTTERANCES:
            return [self._error(SessionRefused("too_many_pending_utterances", f"{MAX_PENDING_UTTERANCES} utterances "
                                               "are still being transcribed; this one was dropped.", None), client_id)]
        if self.settings.model is None:
            return [self._error(SessionRefused("missing_model", "Name the speech-to-text model first (?model= or "
                                               "session.input_audio_transcription.model).",
                                               "session.input_audio_transcription.model"), client_id)]
        previous, self._last_item = self._last_item, item_id
        self._pending += 1
        return [
            self._event("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id),
            self._event("conversation.item.created", previous_item_id=previous, item={
                "id": item_id, "object": "realtime.item", "type": "message", "status": "completed", "role": "user",
                "content": [{"type": "input_audio", "transcript": None}]}),
            Transcribe(item_id, pcm, self.settings),
        ]

    def _commit(self, event: dict[str, Any]) -> list[Action]:
        if len(self._buffer) < audio.samples_of(MIN_COMMIT_MS) * 2:
            raise SessionRefused("input_audio_buffer_commit_empty", f"The buffer holds "
                                 f"{audio.ms_of(len(self._buffer) // 2)} ms of audio; a commit takes at least "
                                 f"{MIN_COMMIT_MS} ms.", None)
        item = self._turn_item or self._new_id("item")
        self._turn_item = None
        self._turn = TurnState(windows=self._turn.windows)
        pcm = bytes(self._buffer)
        self._buffer_start += len(self._buffer) // 2
        self._buffer.clear()
        return self._committed(item, pcm, event.get("event_id"))

    def _clear(self, event: dict[str, Any]) -> list[Action]:
        self._buffer_start += len(self._buffer) // 2
        self._buffer.clear()
        self._turn = TurnState(windows=self._turn.windows)
        self._turn_item = None
        return [self._event("input_audio_buffer.cleared")]

    def _cancel(self, event: dict[str, Any]) -> list[Action]:
        if self.response_id is None:
            raise SessionRefused("response_cancel_not_active", "No response is in progress.", None)
        return [CancelResponse(self.response_id, "client_cancelled")]

    # what the socket reports -----------------------------------------------------------

    def transcript_delta(self, item_id: str, delta: str) -> list[Action]:
        return [self._event("conversation.item.input_audio_transcription.delta", item_id=item_id, content_index=0,
                            delta=delta)]

    def transcript_done(self, item_id: str, transcript: str) -> list[Action]:
        self._pending = max(0, self._pending - 1)
        actions: list[Action] = [self._event("conversation.item.input_audio_transcription.completed",
                                             item_id=item_id, content_index=0, transcript=transcript)]
        response = self.settings.response
        if response is not None and transcript.strip():
            if self.response_id is not None:
                actions.append(CancelResponse(self.response_id, "turn_detected"))
            self.response_id = self._new_id("resp")
            actions.append(Respond(self.response_id, item_id, transcript.strip(), response))
        return actions

    def transcript_failed(self, item_id: str, code: str, message: str) -> list[Action]:
        self._pending = max(0, self._pending - 1)
        return [self._event("conversation.item.input_audio_transcription.failed", item_id=item_id, content_index=0,
                            error={"type": "transcription_error", "code": code, "message": message, "param": None})]

    def response_ended(self, response_id: str) -> None:
        if self.response_id == response_id:
            self.response_id = None

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """A server event with a fresh id (for the response step's events)."""
        return self._event(kind, **fields).event


_HANDLERS: dict[str, Callable[[Session, dict[str, Any]], list[Action]]] = {
    "session.update": Session._update,
    "transcription_session.update": Session._update,
    "input_audio_buffer.append": Session._append,
    "input_audio_buffer.commit": Session._commit,
    "input_audio_buffer.clear": Session._clear,
    "response.cancel": Session._cancel,
}


__all__ = ["DEFAULT_OUTPUT_TOKENS", "MAX_APPEND_BYTES", "MAX_BUFFER_BYTES", "MAX_BUFFER_MS", "MAX_OUTPUT_TOKENS",
           "MAX_PENDING_UTTERANCES", "MIN_COMMIT_MS", "WAV_HEADER_BYTES", "Action", "CancelResponse", "Classify", "Respond",
           "ResponseSettings", "Send", "Session", "SessionRefused", "SessionSettings", "Transcribe", "error_event",
           "session_object", "updated_settings"]
