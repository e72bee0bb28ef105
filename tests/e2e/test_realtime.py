"""Realtime voice end to end on real nodes: a WebSocket client speaks the OpenAI realtime
dialect into node A (`WS /v1/realtime`), streaming an espeak-ng sentence as 24 kHz PCM16 in
20 ms frames, while the speech models run on node B (the generated `local/tiny-whisper`,
`local/tiny-piper`, and the tiny chat model `local/tiny-llama-gguf`).

Server VAD finds the turn (speech_started / speech_stopped), commits it, and node B's
Whisper transcribes it (completed), for a beta-dialect client and for the official OpenAI
SDK's GA realtime client alike. With the response step on, the transcript goes to the
chat model and its answer to the Piper voice: text and audio deltas come back. Speaking
over a running response (barge-in), `response.cancel`, and closing the socket each cancel
it, and the runner serving it says so itself (its supervisor counts streams the runner
ended as cancelled). Afterwards no audio bytes
are in either node's data dir, log or State."""

from __future__ import annotations

import base64
import json
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from websockets.sync.client import ClientConnection, connect

from skulk.api.realtime import audio
from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.e2e.test_openai_serving import place, wait_instance_ready
from tests.e2e.test_vision import files_under
from tests.nodeproc import NodeProcess, wait_for
from tests.speech_kit import spoken_wav

pytestmark = pytest.mark.timeout(600)

STT, TTS, CHAT = "local/tiny-whisper", "local/tiny-piper", "local/tiny-llama-gguf"
FRAME_SAMPLES = 480
"""20 ms at 24 kHz: what a realtime client sends per append."""
BETA = {"OpenAI-Beta": "realtime=v1"}
"""What a client speaking the beta dialect sends (`transcription_session.*` events)."""
EVENT_DEADLINE_S = 120.0
"""A hang guard for the next awaited event (a cold runner on a busy 2-core machine)."""


def spoken_pcm(tmp_path: Path, text: str, lead_s: float = 1.0, tail_s: float = 1.5) -> bytes:
    """`text` spoken by espeak-ng as 24 kHz PCM16, between stretches of silence."""
    path = tmp_path / "spoken.wav"
    spoken_wav(text, path)
    with wave.open(str(path)) as wav:
        samples = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.int16)
        rate = wav.getframerate()
    speech = audio.resample(samples, rate, audio.WIRE_RATE)
    return np.concatenate([np.zeros(int(lead_s * audio.WIRE_RATE), np.int16), speech,
                           np.zeros(int(tail_s * audio.WIRE_RATE), np.int16)]).astype("<i2").tobytes()


def stream(ws: ClientConnection, pcm: bytes) -> None:
    for at in range(0, len(pcm), FRAME_SAMPLES * 2):
        ws.send(json.dumps({"type": "input_audio_buffer.append",
                            "audio": base64.b64encode(pcm[at:at + FRAME_SAMPLES * 2]).decode()}))


def until(ws: ClientConnection, kind: str, seen: list[dict[str, Any]]) -> dict[str, Any]:
    """Events (kept in `seen`) up to and including the first of type `kind`; an `error`
    event on the way fails the test."""
    deadline = time.monotonic() + EVENT_DEADLINE_S
    while True:
        event = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        seen.append(event)
        assert event["type"] != "error", event
        if event["type"] == kind:
            return event


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def placed_on(a: NodeProcess, model: str, excluded: str) -> None:
    body = wait_instance_ready(a, place(a, modelId=model, excludedNodes=[excluded])["instanceId"], timeout_s=240)
    assert {s["nodeId"] for s in body["shards"]} != {excluded}


def runner_cancels(node: NodeProcess) -> int:
    runners = node.get("/v1/diagnostics/node").json()["worker"]["runners"]
    return sum(r["cancelledByRunner"] for r in runners.values())


def test_realtime_voice_through_node_a_served_on_node_b(spawn_node, tmp_path):
    pcm = spoken_pcm(tmp_path, "Hello there. Please tell me what the weather is like today.")
    a, b = start_linked(spawn_node, ["voice-a", "voice-b"])
    wait_agreed([a, b], members=2)
    a_id = node_id(a)
    placed_on(a, STT, a_id)
    url = a.url.replace("http://", "ws://") + f"/v1/realtime?intent=transcription&model={STT}"

    # Transcription with server VAD: one sentence is one turn, transcribed on node B.
    with connect(url, max_size=None, additional_headers=BETA) as ws:
        seen: list[dict[str, Any]] = []
        created = until(ws, "transcription_session.created", seen)
        assert created["session"]["input_audio_transcription"]["model"] == STT
        ws.send(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_format": "pcm16", "input_audio_transcription": {"model": STT, "language": "en"},
            "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                               "silence_duration_ms": 500}}}))
        until(ws, "transcription_session.updated", seen)
        stream(ws, pcm)
        completed = until(ws, "conversation.item.input_audio_transcription.completed", seen)
    order = kinds(seen)
    for before, after in [("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"),
                          ("input_audio_buffer.speech_stopped", "input_audio_buffer.committed"),
                          ("input_audio_buffer.committed", "conversation.item.created"),
                          ("conversation.item.created", "conversation.item.input_audio_transcription.completed")]:
        assert order.index(before) < order.index(after), order
    assert order.count("input_audio_buffer.speech_started") == 1, order
    started = next(e for e in seen if e["type"] == "input_audio_buffer.speech_started")
    stopped = next(e for e in seen if e["type"] == "input_audio_buffer.speech_stopped")
    assert 600 <= started["audio_start_ms"] <= 1000 < stopped["audio_end_ms"], (started, stopped)
    assert started["item_id"] == stopped["item_id"] == completed["item_id"]
    assert isinstance(completed["transcript"], str)
    deltas = "".join(e["delta"] for e in seen if e["type"] == "conversation.item.input_audio_transcription.delta")
    assert deltas.strip() == completed["transcript"]

    # The official OpenAI SDK (GA dialect: session.* events, audio.input settings) gets the same.
    sdk = openai.OpenAI(base_url=a.url + "/v1", api_key="unused", max_retries=0)
    with sdk.realtime.connect(model=STT, extra_query={"intent": "transcription"}) as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={"type": "transcription", "audio": {"input": {  # pyright: ignore[reportArgumentType]
            "format": {"type": "audio/pcm", "rate": 24000}, "transcription": {"model": STT, "language": "en"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}})
        ga_seen = []
        while not ga_seen or ga_seen[-1].type != "session.updated":
            ga_seen.append(connection.recv())
            assert ga_seen[-1].type != "error", ga_seen[-1]
        for at in range(0, len(pcm), FRAME_SAMPLES * 2):
            connection.input_audio_buffer.append(audio=base64.b64encode(pcm[at:at + FRAME_SAMPLES * 2]).decode())
        while ga_seen[-1].type != "conversation.item.input_audio_transcription.completed":
            ga_seen.append(connection.recv())
            assert ga_seen[-1].type != "error", ga_seen[-1]
    assert [e.type for e in ga_seen].count("input_audio_buffer.committed") == 1
    assert ga_seen[-1].transcript == completed["transcript"]  # pyright: ignore[reportAttributeAccessIssue]  # the same audio, the same transcript

    # The response step: the transcript to the chat model, its answer spoken by the Piper voice.
    placed_on(a, CHAT, a_id)
    placed_on(a, TTS, a_id)
    with connect(url, max_size=None, additional_headers=BETA) as ws:
        seen = []
        until(ws, "transcription_session.created", seen)
        ws.send(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_transcription": {"model": STT},
            "response": {"model": CHAT, "tts_model": TTS, "voice": "birch", "max_output_tokens": 12}}}))
        until(ws, "transcription_session.updated", seen)
        stream(ws, pcm)
        done = until(ws, "response.done", seen)
        assert done["response"]["status"] == "completed", done
        text = "".join(e["delta"] for e in seen if e["type"] == "response.audio_transcript.delta")
        assert text and done["response"]["output"][0]["content"][0]["transcript"] == text
        spoken = b"".join(base64.b64decode(e["delta"]) for e in seen if e["type"] == "response.audio.delta")
        assert len(spoken) > 2 * audio.WIRE_RATE // 10, "less than 0.1 s of speech came back"
        assert len(spoken) % 2 == 0

        # Barge-in: a long answer, spoken over as soon as it starts, is cancelled on the runner.
        cancels_before = runner_cancels(b)
        ws.send(json.dumps({"type": "transcription_session.update", "session": {
            "response": {"model": CHAT, "tts_model": TTS, "max_output_tokens": 1024}}}))
        until(ws, "transcription_session.updated", seen)
        seen = []
        stream(ws, pcm)
        until(ws, "response.audio_transcript.delta", seen)  # the chat model is answering
        stream(ws, pcm[int(0.9 * audio.WIRE_RATE) * 2:])  # speech at once
        cancelled = until(ws, "response.done", seen)
        assert cancelled["response"]["status"] == "cancelled", cancelled
        assert cancelled["response"]["status_details"]["reason"] == "turn_detected"
        assert kinds(seen).index("input_audio_buffer.speech_started") < kinds(seen).index("response.done")
    wait_for(lambda: runner_cancels(b) > cancels_before, timeout_s=60, interval_s=0.25,
             what="node B's runner ending the barged-in response as cancelled")

    # response.cancel stops it too; and closing the socket mid-answer cancels what runs for it.
    long_answer = {"type": "transcription_session.update", "session": {
        "input_audio_transcription": {"model": STT}, "response": {"model": CHAT, "max_output_tokens": 1024}}}
    with connect(url, max_size=None, additional_headers=BETA) as ws:
        seen = []
        ws.send(json.dumps(long_answer))
        until(ws, "transcription_session.updated", seen)
        stream(ws, pcm)
        until(ws, "response.text.delta", seen)
        ws.send(json.dumps({"type": "response.cancel"}))
        cancelled = until(ws, "response.done", seen)
        assert cancelled["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    cancels_before = runner_cancels(b)
    with connect(url, max_size=None, additional_headers=BETA) as ws:
        seen = []
        ws.send(json.dumps(long_answer))
        until(ws, "transcription_session.updated", seen)
        stream(ws, pcm)
        until(ws, "response.text.delta", seen)  # running on node B's runner when the socket closes
    wait_for(lambda: runner_cancels(b) > cancels_before, timeout_s=60, interval_s=0.25,
             what="node B's runner ending a closed socket's response as cancelled")

    # No audio anywhere a node keeps things: not the PCM sent, not its base64, not the WAV made of it.
    middle = len(pcm) // 2
    raw = pcm[middle:middle + 64]
    encoded = base64.b64encode(pcm[:FRAME_SAMPLES * 2 * 40])[1000:1064]
    heard, _ = audio.downsample_24k_to_16k(audio.pcm_of(b""), audio.pcm_of(pcm))
    heard_raw = heard.astype("<i2").tobytes()[len(heard) : len(heard) + 64]
    for node in (a, b):
        state = node.get("/state").content
        for needle in (raw, encoded, heard_raw):
            assert needle not in state
        for path in [*files_under(node.data_dir), *([node.log_path] if node.log_path else [])]:
            content = path.read_bytes()
            for needle in (raw, encoded, heard_raw):
                assert needle not in content, f"audio bytes in {path}"
