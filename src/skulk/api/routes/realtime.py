"""WS /v1/realtime: OpenAI's realtime dialect for transcription sessions, with server VAD
and an optional spoken response step.

The socket is the imperative shell around `skulk.api.realtime.session.Session` (the pure
dialect): it parses frames, runs the VAD a `Classify` asks for, transcribes committed
utterances through the cluster one at a time (`start_workload` + `follow_results`, the
STT model on whichever node serves it), and runs the response step (the chat model through
`start_generation` + `drive`, then the TTS model) as one task that barge-in or
`response.cancel` cancels. Audio lives in this process's memory only, for as long as the
socket needs it; closing the socket cancels every command it started.

What a session may name is checked against the cards here (`refusal`): the STT model must
be placed, `stt`, and declare `audio.supports_realtime`; the response's chat model must
be placed with `text`; its TTS model placed with `tts`, and the voice one of its voices.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from skulk.api.context import ApiContext, api_context
from skulk.api.errors import ApiError
from skulk.api.generation import (
    SocketChannel,
    drive,
    follow_results,
    placed_model,
    start_generation,
    start_workload,
)
from skulk.api.realtime import audio
from skulk.api.realtime.sentences import split_sentences
from skulk.api.realtime.session import (
    Action,
    CancelResponse,
    Classify,
    Intent,
    Respond,
    ResponseSettings,
    Send,
    Session,
    SessionRefused,
    SessionSettings,
    Transcribe,
    error_event,
)
from skulk.api.realtime.vad import VadStream
from skulk.api.routes.responses_socket import origin_allowed
from skulk.shared.reasoning_switches import ON_OFF_SWITCHES
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.ids import ModelId, new_id
from skulk.shared.types.tasks import TextGenerationParams
from skulk.shared.types.workload_io import (
    MAX_SPEECH_INPUT_CHARS,
    SpeechParams,
    SpeechResult,
    TranscriptionParams,
    TranscriptionResult,
)

logger = logging.getLogger(__name__)

router = APIRouter()

IDLE_TIMEOUT_S = 600.0
"""A socket that sends nothing for this long is closed (code 1000)."""
MAX_CONVERSATION_MESSAGES = 16
"""Earlier turns (user transcripts and answers) the response step shows the chat model."""
AUDIO_DELTA_SAMPLES = audio.WIRE_RATE // 2
"""The most audio one `response.audio.delta` carries (0.5 s at 24 kHz)."""
MAX_SESSIONS = 32
"""Realtime sockets one node holds at once (each may keep up to `MAX_BUFFER_BYTES` of audio
and a VAD); one more is told so in an `error` event and closed with 1013 (try again later)."""
CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TRY_AGAIN = 1000, 1008, 1013

COUNTERS: dict[str, int] = {"sessions_open": 0, "sessions_total": 0, "utterances_transcribed": 0,
                            "transcriptions_failed": 0, "responses_started": 0, "responses_cancelled": 0}
"""This process's realtime sessions, for /v1/diagnostics/node (`stats`)."""


def stats() -> dict[str, int]:
    """Realtime sessions open now and since start, utterances and responses (camelCase)."""
    return {"sessionsOpen": COUNTERS["sessions_open"], "sessionsTotal": COUNTERS["sessions_total"],
            "utterancesTranscribed": COUNTERS["utterances_transcribed"],
            "transcriptionsFailed": COUNTERS["transcriptions_failed"],
            "responsesStarted": COUNTERS["responses_started"], "responsesCancelled": COUNTERS["responses_cancelled"]}


def refusal(context: ApiContext, settings: SessionSettings) -> SessionRefused | None:
    """Why a session may not run with `settings` on this cluster now, or None."""
    cards = context.get_cards()
    placed = {instance.model_id for instance in context.list_instances()}
    if settings.model is not None:
        model = placed_model(context, settings.model)
        card = cards.get(ModelId(model))
        param = "session.input_audio_transcription.model"
        if card is None or card.audio is None or "stt" not in card.capabilities:
            return SessionRefused("model_not_stt", f"{settings.model} is not a speech-to-text model.", param)
        if not card.audio.supports_realtime:
            return SessionRefused("model_not_realtime", f"{settings.model}'s card does not declare "
                                  "audio.supports_realtime, so it serves no realtime sessions.", param)
        if model not in placed:
            return SessionRefused("model_not_found", f"{settings.model} is not placed; place it first.", param)
        if settings.language and card.audio.languages and settings.language not in card.audio.languages:
            return SessionRefused("unsupported_language", f"{settings.model} transcribes "
                                  f"{', '.join(card.audio.languages)}, not {settings.language}.",
                                  "session.input_audio_transcription.language")
    response = settings.response
    if response is None:
        return None
    chat = cards.get(ModelId(placed_model(context, response.model)))
    if chat is None or "text" not in chat.capabilities or placed_model(context, response.model) not in placed:
        return SessionRefused("model_not_found", f"{response.model} is not a placed chat model.",
                              "session.response.model")
    if response.tts_model is not None:
        tts = cards.get(ModelId(placed_model(context, response.tts_model)))
        if tts is None or tts.audio is None or "tts" not in tts.capabilities \
                or placed_model(context, response.tts_model) not in placed:
            return SessionRefused("model_not_found", f"{response.tts_model} is not a placed text-to-speech model.",
                                  "session.response.tts_model")
        if response.voice is not None and response.voice not in tts.audio.voices:
            return SessionRefused("unknown_voice", f"{response.tts_model} speaks with {', '.join(tts.audio.voices)}, "
                                  f"not {response.voice}.", "session.response.voice")
    elif response.voice is not None:
        return SessionRefused("invalid_value", "'voice' needs a 'tts_model' to speak with.", "session.response.voice")
    return None


def spoken_thinking(card: ModelCard | None) -> bool | None:
    """The response step's `thinking`: off where the model reasons and its template can
    turn that off (the answer is spoken; reasoning would only delay it), else the model's
    own default (its reasoning, if any, is still never spoken)."""
    if card is None or card.reasoning.format == "none":
        return None
    return False if any(s in card.reasoning.switches for s in ON_OFF_SWITCHES) else None


class _Socket:
    """One open realtime socket: its session, VAD, transcription queue and response task."""

    def __init__(self, websocket: WebSocket, context: ApiContext, session: Session) -> None:
        self.websocket, self.context, self.session = websocket, context, session
        self.closed = asyncio.Event()
        self.channel = SocketChannel(self.closed)
        self.vad = VadStream()
        self.utterances: asyncio.Queue[Transcribe] = asyncio.Queue()
        self.response: tuple[str, asyncio.Task[None]] | None = None
        self.cancel_reason = "turn_detected"
        self.conversation: deque[ChatMessage] = deque(maxlen=MAX_CONVERSATION_MESSAGES)
        self._send_lock = asyncio.Lock()

    async def send(self, event: dict[str, Any]) -> None:
        if self.closed.is_set():
            return
        async with self._send_lock:
            await self.websocket.send_text(json.dumps(event, separators=(",", ":"), ensure_ascii=False))

    async def perform(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                await self.send(action.event)
            elif isinstance(action, Classify):
                if action.fresh:
                    self.vad = VadStream()
                probabilities = await asyncio.to_thread(self.vad.push, action.samples)
                await self.perform(self.session.classified(probabilities))
            elif isinstance(action, Transcribe):
                self.utterances.put_nowait(action)  # bounded by the session (MAX_PENDING_UTTERANCES)
            elif isinstance(action, Respond):
                self.response = (action.response_id, asyncio.create_task(self._respond(action)))
            elif isinstance(action, CancelResponse):  # pyright: ignore[reportUnnecessaryIsInstance]
                await self.cancel_response(action.response_id, action.reason)

    async def cancel_response(self, response_id: str, reason: str) -> None:
        if self.response is None or self.response[0] != response_id:
            return
        _, task = self.response
        self.cancel_reason = reason
        task.cancel()
        await asyncio.wait([task])  # its end, not its CancelledError (a cancel of this caller still propagates)

    # -- transcription -------------------------------------------------------------------

    async def transcribe_all(self) -> None:
        """Committed utterances, one at a time, in order."""
        while True:
            utterance = await self.utterances.get()
            await self._transcribe(utterance)

    async def _transcribe(self, utterance: Transcribe) -> None:
        settings = utterance.settings
        assert settings.model is not None  # the session commits only with a model
        samples, _ = audio.downsample_24k_to_16k(audio.pcm_of(b""), audio.pcm_of(utterance.pcm))
        model = placed_model(self.context, settings.model)
        card = self.context.get_cards().get(ModelId(model))
        streaming = bool(card is not None and card.audio is not None and card.audio.supports_streaming)
        try:
            params = TranscriptionParams.of_audio(
                model, audio.wav_bytes(samples, audio.VAD_RATE), language=settings.language, prompt=settings.prompt,
                stream=streaming)
            stream = await start_workload(self.context, params)
            deltas = False
            async with aclosing(follow_results(self.channel, self.context, stream, TranscriptionResult)) as results:
                async for result, _ in results:
                    if not result.final:
                        if result.text:
                            deltas = True
                            await self.perform(self.session.transcript_delta(utterance.item_id, result.text))
                        continue
                    text = result.text.strip()
                    if not deltas and text:
                        await self.perform(self.session.transcript_delta(utterance.item_id, text))
                    await self.perform(self.session.transcript_done(utterance.item_id, text))
        except ApiError as error:
            logger.info("realtime transcription of %s failed: %s", utterance.item_id, error.message)
            COUNTERS["transcriptions_failed"] += 1
            await self.perform(self.session.transcript_failed(utterance.item_id, error.code or error.kind,
                                                              error.message))
        except (WebSocketDisconnect, RuntimeError):
            raise  # the socket is gone
        except Exception as error:  # a bug on our side: say so for this utterance and go on with the next
            logger.exception("realtime transcription of %s failed", utterance.item_id)
            COUNTERS["transcriptions_failed"] += 1
            await self.perform(self.session.transcript_failed(utterance.item_id, "internal_error", str(error)))
        else:
            COUNTERS["utterances_transcribed"] += 1

    # -- the response step ---------------------------------------------------------------

    async def _respond(self, action: Respond) -> None:
        settings = action.settings
        item_id = f"{action.response_id}_item"
        status, reason, text = "completed", None, ""
        COUNTERS["responses_started"] += 1
        await self.send(self.session.event("response.created", response=_response(action.response_id, "in_progress")))
        await self.send(self.session.event("response.output_item.added", response_id=action.response_id,
                                           output_index=0, item=_item(item_id, "in_progress", None)))
        sentences: asyncio.Queue[str | None] = asyncio.Queue()  # bounded by max_output_tokens' text
        speaker = None if settings.tts_model is None else asyncio.create_task(
            self._speak_all(action, item_id, settings, sentences))
        try:
            text = await self._answer(action, item_id, settings, sentences.put_nowait)
            if speaker is not None:
                sentences.put_nowait(None)
                await speaker
        except asyncio.CancelledError:
            status, reason = "cancelled", self.cancel_reason
            COUNTERS["responses_cancelled"] += 1
            raise
        except ApiError as error:
            logger.info("realtime response %s failed: %s", action.response_id, error.message)
            status, reason = "failed", error.message
        except (WebSocketDisconnect, RuntimeError):
            status = "cancelled"
            raise  # the socket is gone
        except Exception as error:  # a bug on our side: the response fails, the session goes on
            logger.exception("realtime response %s failed", action.response_id)
            status, reason = "failed", str(error)
        finally:
            if speaker is not None:  # stopped, and its failure (if any) read, whatever ended the response
                speaker.cancel()
                await asyncio.gather(speaker, return_exceptions=True)
            self.session.response_ended(action.response_id)
            if self.response is not None and self.response[0] == action.response_id:
                self.response = None
            if status == "completed":
                self.conversation.extend([ChatMessage(role="user", content=action.transcript),
                                          ChatMessage(role="assistant", content=text)])
            with contextlib.suppress(Exception):
                kind = "response.audio_transcript.done" if settings.tts_model else "response.text.done"
                await self.send(self.session.event(kind, response_id=action.response_id, item_id=item_id,
                                                   output_index=0, content_index=0,
                                                   **({"transcript": text} if settings.tts_model else {"text": text})))
                await self.send(self.session.event("response.done", response=_response(
                    action.response_id, status, reason, [_item(item_id, "completed" if status == "completed"
                                                                else "incomplete", text, settings.tts_model)])))

    async def _answer(self, action: Respond, item_id: str, settings: ResponseSettings,
                      on_sentence: Callable[[str], None]) -> str:
        """The chat model's answer, streamed as text deltas; each sentence, once finished,
        goes to `on_sentence` (the voice), and the unfinished end when the answer ends."""
        messages = ([ChatMessage(role="system", content=settings.instructions)] if settings.instructions else [])
        messages += [*self.conversation, ChatMessage(role="user", content=action.transcript)]
        model = ModelId(placed_model(self.context, settings.model))
        params = TextGenerationParams(model_id=model, messages=messages, max_tokens=settings.max_output_tokens,
                                      stream=True, thinking=spoken_thinking(self.context.get_cards().get(model)))
        stream = await start_generation(self.context, params, max_tokens_param="session.response.max_output_tokens")
        kind = "response.audio_transcript.delta" if settings.tts_model else "response.text.delta"
        parts: list[str] = []
        pending = ""
        async with aclosing(drive(self.channel, self.context, stream, params)) as chunks:
            async for chunk in chunks:
                if chunk.reasoning or not chunk.text:
                    continue  # hidden reasoning is never spoken
                parts.append(chunk.text)
                await self.send(self.session.event(kind, response_id=action.response_id, item_id=item_id,
                                                   output_index=0, content_index=0, delta=chunk.text))
                ready, pending = split_sentences(pending + chunk.text)
                for sentence in ready:
                    on_sentence(sentence)
        if pending.strip():
            on_sentence(pending.strip())
        return "".join(parts)

    async def _speak_all(self, action: Respond, item_id: str, settings: ResponseSettings,
                         sentences: asyncio.Queue[str | None]) -> None:
        """Each sentence spoken in turn, as the answer produces them, until None."""
        while (sentence := await sentences.get()) is not None:
            await self._speak(action, item_id, settings, sentence)
        await self.send(self.session.event("response.audio.done", response_id=action.response_id, item_id=item_id,
                                           output_index=0, content_index=0))

    async def _speak(self, action: Respond, item_id: str, settings: ResponseSettings, text: str) -> None:
        """`text` spoken by the TTS model, as 24 kHz audio deltas."""
        assert settings.tts_model is not None
        model = placed_model(self.context, settings.tts_model)
        card = self.context.get_cards().get(ModelId(model))
        streaming = bool(card is not None and card.audio is not None and card.audio.supports_streaming)
        params = SpeechParams(model_id=ModelId(model), input=text.strip()[:MAX_SPEECH_INPUT_CHARS],
                              voice=settings.voice, stream=streaming)
        stream = await start_workload(self.context, params)
        async with aclosing(follow_results(self.channel, self.context, stream, SpeechResult)) as results:
            async for result, _ in results:
                pcm = audio.resample(audio.pcm_of(base64.b64decode(result.pcm16_b64)), result.sample_rate,
                                     audio.WIRE_RATE)
                for at in range(0, pcm.size, AUDIO_DELTA_SAMPLES):
                    piece = pcm[at:at + AUDIO_DELTA_SAMPLES].astype("<i2").tobytes()
                    await self.send(self.session.event("response.audio.delta", response_id=action.response_id,
                                                       item_id=item_id, output_index=0, content_index=0,
                                                       delta=base64.b64encode(piece).decode("ascii")))


def _item(item_id: str, status: str, text: str | None, tts_model: str | None = None) -> dict[str, Any]:
    content = [] if text is None else [{"type": "audio", "transcript": text} if tts_model
                                       else {"type": "text", "text": text}]
    return {"id": item_id, "object": "realtime.item", "type": "message", "status": status, "role": "assistant",
            "content": content}


def _response(response_id: str, status: str, reason: str | None = None,
              output: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    details = None if reason is None else {"type": status, "reason": reason}
    return {"id": response_id, "object": "realtime.response", "status": status, "status_details": details,
            "output": output or []}


def _intent(websocket: WebSocket) -> Intent:
    return "conversation" if websocket.query_params.get("intent") == "conversation" else "transcription"


OpenSession = Callable[[WebSocket, ApiContext], Awaitable[Session | None]]
"""How a route opens its session on an accepted, admitted socket: the session, or None
when it has already refused (and closed) the socket."""


async def serve(websocket: WebSocket, open_session: OpenSession) -> None:
    """The shell every realtime-dialect socket shares (`/v1/realtime`, `/v1/fabric/chains/
    speech`): origin check, subprotocol, admission (`MAX_SESSIONS`), then the session
    `open_session` configures, run until the client leaves or idles out; closing cancels
    every command the socket started."""
    context = api_context(websocket)
    if not origin_allowed(websocket.headers.get("origin"), context.cors_origins):
        await websocket.close(CLOSE_POLICY, "this origin may not open a WebSocket here")
        return
    # Browsers offer ["realtime", "openai-insecure-api-key.<key>"] (the key was checked by
    # the access middleware); the answer names "realtime", never echoing the key.
    protocols = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol="realtime" if "realtime" in protocols else None)
    if COUNTERS["sessions_open"] >= MAX_SESSIONS:
        await websocket.send_text(json.dumps(error_event(
            f"event_{new_id()}", "too_many_sessions", f"This node holds {MAX_SESSIONS} realtime sessions already; "
            "try again later or connect to another node.", error_type="server_error")))
        await websocket.close(CLOSE_TRY_AGAIN, "too many realtime sessions")
        return
    COUNTERS["sessions_open"] += 1  # held from here: a socket still naming its session counts too
    try:
        try:
            session = await open_session(websocket, context)
        except (WebSocketDisconnect, RuntimeError):
            return
        if session is not None:
            COUNTERS["sessions_total"] += 1
            await _run(websocket, context, session)
    finally:
        COUNTERS["sessions_open"] -= 1


async def _run(websocket: WebSocket, context: ApiContext, session: Session) -> None:
    socket = _Socket(websocket, context, session)
    transcriber = asyncio.create_task(socket.transcribe_all())
    logger.info("realtime session %s opened", session.session_id)
    try:
        await socket.perform(session.opened())
        while True:
            try:
                async with asyncio.timeout(IDLE_TIMEOUT_S):
                    text = await websocket.receive_text()
            except TimeoutError:
                await websocket.close(CLOSE_NORMAL, f"idle for {IDLE_TIMEOUT_S:.0f} s")
                return
            try:
                event: object = json.loads(text)
            except ValueError:
                event = None
            await socket.perform(session.receive(event))
    except (WebSocketDisconnect, RuntimeError):
        return
    finally:
        socket.closed.set()  # every command this socket started is cancelled (their channel closed)
        tasks = [transcriber] + ([socket.response[1]] if socket.response is not None else [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        logger.info("realtime session %s closed", session.session_id)


@router.websocket("/v1/realtime")
async def realtime_socket(websocket: WebSocket) -> None:
    async def open_session(websocket: WebSocket, context: ApiContext) -> Session:
        beta = "realtime=v1" in websocket.headers.get("openai-beta", "")
        return Session(_intent(websocket), SessionSettings(model=websocket.query_params.get("model") or None),
                       lambda settings: refusal(context, settings), lambda prefix: f"{prefix}_{new_id()}", beta=beta)

    await serve(websocket, open_session)


__all__ = ["AUDIO_DELTA_SAMPLES", "CLOSE_NORMAL", "CLOSE_POLICY", "CLOSE_TRY_AGAIN", "COUNTERS", "IDLE_TIMEOUT_S",
           "MAX_CONVERSATION_MESSAGES", "MAX_SESSIONS", "OpenSession", "refusal", "router", "serve",
           "spoken_thinking", "stats"]
