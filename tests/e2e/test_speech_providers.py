"""The first-party speech providers on real nodes, called through the real fabric: node A's
capability WebSocket opens each call on node B, where the providers run over B's own core
serving (`local/tiny-whisper`, `local/tiny-piper` placed on B only).

vad@1.0.0 is advertised with no model at all and finds the turn in an espeak-ng sentence
(speech_started, then speech_stopped on the silence after it); stt@, stt.realtime@ and tts@
are listed but not advertised, and refused by name, until their models are ready; then stt@
answers one transcript for audio sent in chunks and half-closed, stt.realtime@ finds the turn
in a live stream and transcribes it, tts@ answers MP3 frames that decode to the voice's rate,
and cancelling a tts@ call reaches the runner (which counts the stream it ended as
cancelled)."""

from __future__ import annotations

import base64
import io
import json
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from websockets.sync.client import ClientConnection, connect

from skulk.api.realtime import audio
from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.e2e.test_openai_serving import place, wait_instance_ready
from tests.nodeproc import NodeProcess, wait_for
from tests.speech_kit import spoken_wav

pytestmark = pytest.mark.timeout(600)

STT, TTS = "local/tiny-whisper", "local/tiny-piper"
VAD_TAG, STT_TAG, TTS_TAG, REALTIME_TAG = "vad@1.0.0", "stt@1.0.0", "tts@1.0.0", "stt.realtime@1.0.0"
CALL_DEADLINE_S = 120.0
"""A hang guard for one frame of a call (a cold runner on a busy 2-core machine)."""
TERMINALS = ("completed", "failed", "cancelled")


def tags_of(a: NodeProcess, b_id: str) -> set[str]:
    return set(a.get("/state").json().get("nodeResources", {}).get(b_id, {}).get("capabilityTags", []))


def rows_on(a: NodeProcess, b_id: str) -> dict[str, dict[str, Any]]:
    def found() -> dict[str, dict[str, Any]] | None:
        rows = {row["id"]: row for row in a.get("/v1/capabilities").json()["data"] if row["node"] == b_id}
        return rows if {"vad", "stt", "stt.realtime", "tts"} <= set(rows) else None

    return cast(dict[str, dict[str, Any]], wait_for(found, timeout_s=30, what="B's speech capabilities listed by A"))


@contextmanager
def opened(a: NodeProcess, row: dict[str, Any], payload: Any = None) -> Iterator[ClientConnection]:
    """A call opened on node A's capability socket (its first frame sent)."""
    with connect(f"ws://127.0.0.1:{a.api_port}/v1/capabilities/{row['id']}/socket", additional_headers=a.auth,
                 open_timeout=CALL_DEADLINE_S, max_size=None) as socket:
        body = {"node": row["node"], "version": row["version"], "revision": row["revision"], "timeoutS": 300}
        socket.send(json.dumps(body if payload is None else {**body, "input": payload}))
        yield socket


def read_to_end(socket: ClientConnection, received: list[dict[str, Any]]) -> list[dict[str, Any]]:
    while not received or received[-1]["type"] not in TERMINALS:
        received.append(json.loads(socket.recv(timeout=CALL_DEADLINE_S)))
    return received


def call(a: NodeProcess, row: dict[str, Any], inputs: list[Any], payload: Any = None) -> list[dict[str, Any]]:
    """One call: `inputs` sent as input chunks then a half-close (streaming input only)."""
    with opened(a, row, payload) as socket:
        received = [json.loads(socket.recv(timeout=CALL_DEADLINE_S))]
        if received[0]["type"] == "started" and row["ioMode"] in ("client_streaming", "bidi_streaming"):
            for value in inputs:
                socket.send(json.dumps({"type": "input", "input": value}))
            socket.send(json.dumps({"type": "complete"}))
        return read_to_end(socket, received)


def outputs(frames: list[dict[str, Any]]) -> list[Any]:
    assert frames[-1]["type"] == "completed", frames[-1]
    return [f["output"] for f in frames if f["type"] == "chunk"]


def spoken(tmp_path: Path, text: str) -> tuple[bytes, np.ndarray, int]:
    """An espeak-ng WAV file's bytes, and its samples and rate."""
    data = spoken_wav(text, tmp_path / "spoken.wav")
    with wave.open(io.BytesIO(data)) as wav:
        return data, np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.int16), wav.getframerate()


def decoded_mp3(body: bytes) -> tuple[int, float]:
    import av

    with av.open(io.BytesIO(body), mode="r") as container:
        frames = list(container.decode(container.streams.audio[0]))
    return frames[0].sample_rate, sum(f.samples for f in frames) / frames[0].sample_rate


def runner_cancels(node: NodeProcess) -> int:
    runners = node.get("/v1/diagnostics/node").json()["worker"]["runners"]
    return sum(r["cancelledByRunner"] for r in runners.values())


def test_speech_providers_called_across_nodes(spawn_node, tmp_path):
    wav_data, samples, rate = spoken(tmp_path, "Hello there. Please tell me what the weather is like today.")
    a, b = start_linked(spawn_node, ["sp-a", "sp-b"])
    wait_agreed([a, b], members=2)
    a_id, b_id = node_id(a), node_id(b)
    rows = rows_on(a, b_id)
    assert rows["vad"]["ioMode"] == "bidi_streaming" and rows["stt"]["ioMode"] == "client_streaming"
    assert rows["tts"]["ioMode"] == "server_streaming"

    # No speech model anywhere: vad@ advertised, stt@ and tts@ not, and refused by name.
    wait_for(lambda: VAD_TAG in tags_of(a, b_id), timeout_s=30, what="B's vad@ tag seen by A")
    assert not {STT_TAG, TTS_TAG, REALTIME_TAG} & tags_of(a, b_id)
    refused = call(a, rows["stt"], [])
    assert refused[-1]["code"] == "admission_refused" and "speech-to-text" in refused[-1]["detail"], refused
    refused = call(a, rows["tts"], [], {"input": "Hello."})
    assert refused[-1]["code"] == "admission_refused", refused

    # vad@ on 48 kHz audio: 1 s of silence, the sentence, 1.5 s of silence, in 250 ms chunks.
    speech = audio.resample(samples, rate, 48_000)
    pcm = np.concatenate([np.zeros(48_000, np.int16), speech, np.zeros(72_000, np.int16)]).astype("<i2").tobytes()
    step = 48_000 // 4 * 2
    chunks = [{"audio": base64.b64encode(pcm[at:at + step]).decode(), "sampleRate": 48_000}
              for at in range(0, len(pcm), step)]
    events = outputs(call(a, rows["vad"], chunks))
    assert [e["type"] for e in events] == ["speech_started", "speech_stopped"], events
    assert 600 <= events[0]["audioStartMs"] <= 1000 < events[1]["audioEndMs"], events
    assert events[1]["reason"] == "silence"
    bad = call(a, rows["vad"], [{"audio": "%%", "sampleRate": 16_000}])
    assert bad[-1]["type"] == "failed" and bad[-1]["code"] == "input_invalid", bad

    # The speech models on B: stt@ and tts@ are advertised once they are ready.
    for model in (STT, TTS):
        wait_instance_ready(a, place(a, modelId=model, excludedNodes=[a_id])["instanceId"], timeout_s=240)
    wait_for(lambda: {STT_TAG, TTS_TAG, REALTIME_TAG} <= tags_of(a, b_id), timeout_s=30,
             what="B's stt@, stt.realtime@ and tts@ tags")

    # stt@: the WAV in 16 KiB chunks, half-closed, one final transcript (random weights: its shape).
    step = 16 * 1024
    pieces = [{"audio": base64.b64encode(wav_data[at:at + step]).decode()} for at in range(0, len(wav_data), step)]
    pieces[0] |= {"model": STT, "language": "en"}
    (transcript,) = outputs(call(a, rows["stt"], pieces))
    assert transcript["model"] == STT and isinstance(transcript["text"], str) and transcript["durationS"] > 0
    bad = call(a, rows["stt"], [{"audio": base64.b64encode(b"not audio at all").decode()}])
    assert bad[-1]["type"] == "failed" and bad[-1]["code"] == "input_invalid", bad

    # stt.realtime@: the same 48 kHz stream; the turn is found, then transcribed as item 0.
    live = [dict(chunks[0], model=STT, language="en"), *chunks[1:]]
    events = outputs(call(a, rows["stt.realtime"], live))
    assert [e["type"] for e in events] == ["speech_started", "speech_stopped", "transcript"], events
    assert events[1]["item"] == events[2]["item"] == 0 and isinstance(events[2]["text"], str)
    (queues,) = b.get("/v1/diagnostics/node").json()["capabilities"]["speechProviders"]
    assert queues == {"capability": REALTIME_TAG, "pendingTurns": [], "overloaded": 0}  # the call's queue is gone
    bad = call(a, rows["stt.realtime"], [dict(chunks[0], model=TTS)])
    assert bad[-1]["type"] == "failed" and bad[-1]["code"] == "input_invalid", bad  # not a realtime STT model

    # tts@: MP3 frames whose concatenation decodes at the voice's rate.
    frames = outputs(call(a, rows["tts"], [], {"input": "Hello there. This is the second sentence.", "model": TTS}))
    assert frames and all(f["format"] == "mp3" and f["sampleRate"] == 22050 for f in frames)
    mp3_rate, seconds = decoded_mp3(b"".join(base64.b64decode(f["audio"]) for f in frames))
    assert mp3_rate == 22050 and seconds > 0.2
    bad = call(a, rows["tts"], [], {"input": "Hello.", "voice": "nobody"})
    assert bad[-1]["type"] == "failed" and bad[-1]["code"] == "input_invalid" and "voice" in bad[-1]["detail"], bad

    # Cancelling a tts@ call reaches the runner on B.
    before = runner_cancels(b)
    long_text = " ".join(f"This is sentence number {n} of a long text to speak." for n in range(60))
    with opened(a, rows["tts"], {"input": long_text}) as socket:
        received = [json.loads(socket.recv(timeout=CALL_DEADLINE_S))]
        while received[-1]["type"] != "chunk":
            received.append(json.loads(socket.recv(timeout=CALL_DEADLINE_S)))
            assert received[-1]["type"] not in TERMINALS, received
        socket.send(json.dumps({"type": "cancel"}))
        assert read_to_end(socket, received)[-1]["type"] == "cancelled", received[-1]
    wait_for(lambda: runner_cancels(b) > before, timeout_s=60, what="B's runner ended the stream as cancelled")
