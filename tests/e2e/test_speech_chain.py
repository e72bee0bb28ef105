"""The speech chain end to end on real nodes: a WebSocket client opens
`WS /v1/fabric/chains/speech` on node A, names its participants in the first frame, and
streams an espeak-ng sentence as 24 kHz PCM16 in 20 ms frames, while the models run on
node B (the generated `local/tiny-whisper`, `local/tiny-piper`, `local/tiny-llama-gguf`).

With `stt` alone, server VAD finds the turn (speech_started / speech_stopped) and B's
Whisper transcribes it; with `stt` + `chat` + `tts`, the answer comes back as text and
audio events. Barge-in and `response.cancel` reach the runner serving the answer (its supervisor
counts the stream as cancelled). A first frame naming a model in the wrong role, one not
placed, or a voice the TTS model lacks is one typed `error` event, then a 1008 close."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from skulk.api.realtime import audio
from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.e2e.test_realtime import CHAT, STT, TTS, kinds, placed_on, runner_cancels, spoken_pcm, stream, until
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(600)

CLOSE_DEADLINE_S = 30.0
"""A hang guard for the close that follows a refused first frame."""


def chain(**session: Any) -> str:
    return json.dumps({"type": "session.update", "session": session})


def refused(ws: ClientConnection) -> dict[str, Any]:
    """The refusal's error, after checking the socket is then closed with 1008."""
    error = json.loads(ws.recv(timeout=CLOSE_DEADLINE_S))
    assert error["type"] == "error", error
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=CLOSE_DEADLINE_S)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    return error["error"]


def test_speech_chain_through_node_a_served_on_node_b(spawn_node, tmp_path):
    pcm = spoken_pcm(tmp_path, "Hello there. Please tell me what the weather is like today.")
    a, b = start_linked(spawn_node, ["chain-a", "chain-b"])
    wait_agreed([a, b], members=2)
    a_id = node_id(a)
    placed_on(a, STT, a_id)
    url = a.url.replace("http://", "ws://") + "/v1/fabric/chains/speech"

    # stt only: turns found by server VAD, transcribed on node B.
    with connect(url, max_size=None) as ws:
        seen: list[dict[str, Any]] = []
        ws.send(chain(stt={"model": STT, "language": "en"}, turn_detection={"type": "server_vad",
                                                                           "silence_duration_ms": 500}))
        created = until(ws, "session.created", seen)
        assert created["session"]["input_audio_transcription"]["model"] == STT
        assert created["session"]["response"] is None
        stream(ws, pcm)
        completed = until(ws, "conversation.item.input_audio_transcription.completed", seen)
    order = kinds(seen)
    for before, after in [("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"),
                          ("input_audio_buffer.speech_stopped", "input_audio_buffer.committed"),
                          ("input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed")]:
        assert order.index(before) < order.index(after), order
    assert isinstance(completed["transcript"], str)
    assert "response.created" not in order

    # Refusals of the first frame: a model in the wrong role, not placed, a voice it lacks.
    placed_on(a, CHAT, a_id)
    for frame, code, param in [
        (chain(stt={"model": CHAT}), "model_wrong_kind", "session.stt.model"),
        (chain(stt={"model": STT}, chat={"model": STT}), "model_wrong_kind", "session.chat.model"),
        (chain(stt={"model": STT}, chat={"model": CHAT}, tts={"model": TTS}), "model_not_placed",
         "session.tts.model"),
    ]:
        with connect(url, max_size=None) as ws:
            ws.send(frame)
            error = refused(ws)
            assert (error["code"], error["param"]) == (code, param), error
    placed_on(a, TTS, a_id)
    with connect(url, max_size=None) as ws:
        ws.send(chain(stt={"model": STT}, chat={"model": CHAT}, tts={"model": TTS, "voice": "nobody"}))
        error = refused(ws)
        assert (error["code"], error["param"]) == ("unknown_voice", "session.tts.voice"), error

    # stt + chat + tts: the transcript answered by the chat model and spoken by the Piper voice.
    with connect(url, max_size=None) as ws:
        seen = []
        ws.send(chain(stt={"model": STT}, chat={"model": CHAT, "max_output_tokens": 12},
                      tts={"model": TTS, "voice": "birch"}))
        until(ws, "session.created", seen)
        stream(ws, pcm)
        done = until(ws, "response.done", seen)
        assert done["response"]["status"] == "completed", done
        text = "".join(e["delta"] for e in seen if e["type"] == "response.audio_transcript.delta")
        assert text and done["response"]["output"][0]["content"][0]["transcript"] == text
        spoken = b"".join(base64.b64decode(e["delta"]) for e in seen if e["type"] == "response.audio.delta")
        assert len(spoken) > 2 * audio.WIRE_RATE // 10, "less than 0.1 s of speech came back"

        # Barge-in: a long spoken answer, spoken over as soon as it starts, is cancelled on the runner.
        cancels_before = runner_cancels(b)
        ws.send(chain(stt={"model": STT}, chat={"model": CHAT, "max_output_tokens": 1024}, tts={"model": TTS}))
        until(ws, "session.updated", seen)
        seen = []
        stream(ws, pcm)
        until(ws, "response.audio_transcript.delta", seen)  # the chat model is answering
        stream(ws, pcm[int(0.9 * audio.WIRE_RATE) * 2:])  # speech at once
        cancelled = until(ws, "response.done", seen)
        assert cancelled["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
        assert kinds(seen).index("input_audio_buffer.speech_started") < kinds(seen).index("response.done")
        wait_for(lambda: runner_cancels(b) > cancels_before, timeout_s=60, interval_s=0.25,
                 what="node B's runner ending the barged-in chain response as cancelled")

        # response.cancel on a long answer: the runner serving it ends it as cancelled.
        cancels_before = runner_cancels(b)
        ws.send(chain(stt={"model": STT}, chat={"model": CHAT, "max_output_tokens": 1024}))
        until(ws, "session.updated", seen)
        seen = []
        stream(ws, pcm)
        until(ws, "response.text.delta", seen)
        ws.send(json.dumps({"type": "response.cancel"}))
        cancelled = until(ws, "response.done", seen)
        assert cancelled["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    wait_for(lambda: runner_cancels(b) > cancels_before, timeout_s=60, interval_s=0.25,
             what="node B's runner ending the cancelled chain response as cancelled")
