"""Speech to text end to end on real nodes: the generated `local/tiny-whisper` (a real
CTranslate2 Whisper with random weights) placed on node B only, served by faster-whisper,
asked through node A with the official OpenAI SDK. Speech that espeak-ng spoke demonstrably
reaches the model (the transcript's duration is the WAV's; two recordings give two texts),
every response format and the stream parse as the SDK expects, refusals are typed 4xx in
OpenAI's shape, and afterwards no byte of the audio (raw or base64) is in either node's data
dir, State or log."""

from __future__ import annotations

import base64
import io
import random
import warnings
import wave

import httpx
import openai
import pytest

from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.e2e.test_openai_serving import wait_instance_ready
from tests.e2e.test_vision import files_under
from tests.nodeproc import wait_for
from tests.speech_kit import TINY_WHISPER, require_espeak, silent_wav, spoken_wav, wav_duration_s

pytestmark = pytest.mark.timeout(420)


def noise_wav(seconds: float, rate: int = 16000) -> bytes:
    """`seconds` of quiet noise: long audio that a random Whisper decodes window by window."""
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(bytes(b & 0x0F for b in random.Random(13).randbytes(2 * int(rate * seconds))))
    return out.getvalue()


def stream_counts(node) -> dict:
    """Node A's API stream counters: how its commands' streams ended."""
    return node.get("/v1/diagnostics/node").json()["streams"]


def test_speech_through_node_a_is_transcribed_on_node_b(spawn_node, tmp_path):
    require_espeak()
    first = spoken_wav("hello world, this is a test of speech to text", tmp_path / "first.wav")
    second = spoken_wav("the quick brown fox jumps over the lazy dog and keeps on running", tmp_path / "second.wav")
    a, b = start_linked(spawn_node, ["hear-a", "hear-b"])
    wait_agreed([a, b], members=2)

    def placed() -> httpx.Response | None:
        response = httpx.post(a.url + "/place_instance", json={"modelId": TINY_WHISPER,
                                                               "excludedNodes": [node_id(a)]}, timeout=10)
        return None if response.status_code == 503 else response

    response = wait_for(placed, timeout_s=90, interval_s=0.5, what="tiny-whisper placed")
    assert response.status_code == 200, response.text
    body = wait_instance_ready(a, response.json()["instanceId"], timeout_s=240)
    assert {s["nodeId"] for s in body["shards"]} == {node_id(b)}
    assert all(s["backend"].startswith("faster_whisper") for s in body["shards"])

    sdk = openai.OpenAI(base_url=a.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    transcribe = sdk.audio.transcriptions.create

    # The audio reaches the model: its measured duration, and different speech, different text.
    one = transcribe(model=TINY_WHISPER, file=("first.wav", first, "audio/wav"), response_format="verbose_json")
    two = transcribe(model=TINY_WHISPER, file=("second.wav", second), response_format="verbose_json")
    assert one.duration == pytest.approx(wav_duration_s(first), abs=0.01)
    assert two.duration == pytest.approx(wav_duration_s(second), abs=0.01)
    assert one.text and two.text and one.text != two.text
    assert one.segments and one.segments[0].end > one.segments[0].start >= 0

    # Every response format, as the SDK parses it.
    plain = transcribe(model=TINY_WHISPER, file=("first.wav", first))
    assert plain.text == one.text  # temperature 0: greedy, the same again
    assert transcribe(model=TINY_WHISPER, file=("first.wav", first), response_format="text").strip() == one.text
    srt = transcribe(model=TINY_WHISPER, file=("first.wav", first), response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:") and one.segments[0].text.strip() in srt
    vtt = transcribe(model=TINY_WHISPER, file=("first.wav", first), response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:")
    worded = transcribe(model=TINY_WHISPER, file=("first.wav", first), response_format="verbose_json",
                        timestamp_granularities=["word", "segment"], language="en", prompt="Skulk")
    assert worded.words and all(w.start <= w.end for w in worded.words) and worded.language == "en"

    # Translation to English (the card declares it), and the stream of deltas.
    with warnings.catch_warnings():  # the SDK marks translations deprecated; OpenAI still serves them
        warnings.simplefilter("ignore", DeprecationWarning)
        translated = sdk.audio.translations.create(model=TINY_WHISPER, file=("first.wav", first))
    assert translated.text
    events = list(transcribe(model=TINY_WHISPER, file=("second.wav", second), stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert deltas and events[-1].type == "transcript.text.done"
    assert events[-1].text == "".join(deltas) == two.text

    # Every request so far read its stream to the runner's terminal: completed, none cancelled.
    counts = stream_counts(a)
    assert counts["completed"] == counts["opened"] == 9 and counts["closedByClient"] == counts["cancelled"] == 0, counts

    # A client that leaves a stream cancels its command. The upload (9.6 MB) is over the
    # node's default body limit, which an audio route does not apply.
    long_noise = noise_wav(300.0)
    with httpx.stream("POST", a.url + "/v1/audio/transcriptions", timeout=120,
                      files={"file": ("long.wav", long_noise, "audio/wav")},
                      data={"model": TINY_WHISPER, "stream": "true"}) as streamed:
        assert streamed.status_code == 200
        first_event = next(line for line in streamed.iter_lines() if line.startswith("data: "))
        assert "transcript.text.delta" in first_event
    wait_for(lambda: stream_counts(a)["closedByClient"] == 1, timeout_s=60,
             what="node A to end the left stream as closed by its client (and cancel its command)")

    # Refusals, typed, in OpenAI's shape; the model serves on.
    def refused(error: type[openai.APIStatusError], **fields) -> openai.APIStatusError:
        with pytest.raises(error) as caught:
            transcribe(**{"model": TINY_WHISPER, "file": ("first.wav", first), **fields})
        return caught.value

    assert refused(openai.BadRequestError, file=("notes.wav", b"these are words, not audio" * 40)).code == \
        "audio_invalid"
    assert refused(openai.BadRequestError, file=("empty.wav", silent_wav(0))).code == "audio_empty"
    assert refused(openai.APIStatusError, file=("big.wav", random.Random(7).randbytes(26 * 1024 * 1024))
                   ).status_code == 413
    assert refused(openai.BadRequestError, language="xx").code == "unsupported_language"
    assert refused(openai.BadRequestError, response_format="mp3").param == "response_format"
    not_stt = refused(openai.BadRequestError, model="local/tiny-llama-gguf")
    assert not_stt.code == "model_not_stt" and "local/tiny-llama-gguf" in not_stt.message
    assert transcribe(model=TINY_WHISPER, file=("first.wav", first)).text == one.text

    # No audio anywhere a node keeps things: not in State, the data dirs or the logs.
    needles = []
    for wav in (first, second):
        encoded = base64.b64encode(wav)
        needles += [wav[len(wav) // 2:len(wav) // 2 + 256], encoded[4000:4400]]
    for node in (a, b):
        state = node.get("/state").content
        log = node.log().encode()
        for needle in needles:
            assert needle not in state and needle not in log
        for path in files_under(node.data_dir):
            content = path.read_bytes()
            assert not any(needle in content for needle in needles), f"audio bytes in {path}"
