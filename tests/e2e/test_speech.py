"""Text to speech end to end on real nodes: the generated Piper voice (`local/tiny-piper`)
placed on node B only, asked to speak through node A with the official OpenAI SDK. Every
response format decodes to the voice's rate and the speech's duration; voices and speed are
honoured; a streamed body carries each sentence as its own piece, the first being the first
sentence's audio alone, before the rest; OpenAI's SSE form carries the same audio; the voices
route lists the card's voices; bad requests are typed 400s in OpenAI's shape; and the text
spoken is nowhere in either node's data dir, logs or State."""

from __future__ import annotations

import base64
import io
import json
from typing import Literal, cast

import httpx
import numpy as np
import openai
import pytest

from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.e2e.test_openai_serving import wait_instance_ready
from tests.e2e.test_vision import files_under
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(420)

MODEL = "local/tiny-piper"
RATE = 22050
SECRET = "Quokkas juggle marmalade in Zanzibar"
"""Words that occur nowhere by chance: a search of the data dirs and logs for them means something."""
SENTENCES = [f"{SECRET}.", "The second sentence follows it.", "And then a third one ends the text."]
TEXT = " ".join(SENTENCES)
FORMATS: list[Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]] = ["mp3", "opus", "aac", "flac", "wav", "pcm"]
EXPECTED_RATE = {"opus": 48_000}
"""Opus decodes at 48 kHz whatever it was encoded at."""


def decoded(body: bytes, response_format: str) -> tuple[int, int, float]:
    """(rate, channels, seconds) of an encoded body, decoded by FFmpeg (PyAV)."""
    if response_format == "pcm":
        return RATE, 1, len(body) / 2 / RATE
    import av

    with av.open(io.BytesIO(body), mode="r") as container:
        stream = container.streams.audio[0]
        frames = list(container.decode(stream))
    return frames[0].sample_rate, stream.codec_context.channels, sum(f.samples for f in frames) / frames[0].sample_rate


def shards_of(preview: dict) -> list[dict]:
    return preview.get("instance", preview)["shards"]


def nodes_of(preview: dict) -> set[str]:
    return {shard["nodeId"] for shard in shards_of(preview)}


def backends_of(preview: dict) -> list[str]:
    return [shard["backend"] for shard in shards_of(preview)]


def pcm(sdk: openai.OpenAI, text: str = TEXT, **fields) -> bytes:
    return sdk.audio.speech.create(model=MODEL, input=text, voice=fields.pop("voice", "amber"),
                                   response_format="pcm", **fields).content


def test_speech_through_node_a_from_a_voice_on_node_b(spawn_node):
    a, b = start_linked(spawn_node, ["speak-a", "speak-b"])
    wait_agreed([a, b], members=2)

    # Previews: the voice fits on either node, each a one-node placement on a piper backend.
    def previews() -> list | None:
        found = a.get(f"/instance/previews?modelId={MODEL}").json().get("previews")
        return found if found and len({n for p in found for n in nodes_of(p)}) == 2 else None

    options = cast(list, wait_for(previews, timeout_s=60, interval_s=0.5, what="previews on both nodes"))
    assert all(len(nodes_of(p)) == 1 for p in options), options
    assert all(backend.startswith("piper") for p in options for backend in backends_of(p)), options

    def placed() -> httpx.Response | None:
        response = httpx.post(a.url + "/place_instance", json={"modelId": MODEL, "excludedNodes": [node_id(a)]},
                              timeout=10)
        return None if response.status_code == 503 else response

    response = cast(httpx.Response, wait_for(placed, timeout_s=90, interval_s=0.5, what="the voice placed"))
    assert response.status_code == 200, response.text
    body = wait_instance_ready(a, response.json()["instanceId"], timeout_s=240)
    assert {s["nodeId"] for s in body["shards"]} == {node_id(b)}
    assert all(s["backend"].startswith("piper") for s in body["shards"])

    sdk = openai.OpenAI(base_url=a.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    # The voices route: the card's voices and default, through A.
    voices = httpx.get(a.url + "/v1/audio/voices", timeout=10).json()["data"]
    assert [(v["model"], v["voices"], v["defaultVoice"], v["sampleRate"]) for v in voices] == [
        (MODEL, ["amber", "birch", "cedar"], "amber", RATE)]
    assert httpx.get(a.url + "/v1/audio/voices", params={"model": MODEL}, timeout=10).json()["data"] == voices
    assert httpx.get(a.url + "/v1/audio/voices", params={"model": "local/not-placed"}, timeout=10).status_code == 404

    # PCM: the samples themselves, framed by headers; voices and speed change them.
    raw = sdk.audio.speech.with_raw_response.create(model=MODEL, input=TEXT, voice="amber", response_format="pcm")
    assert raw.headers["x-sample-rate"] == str(RATE) and raw.headers["x-sample-format"] == "s16le"
    amber = raw.content
    seconds = len(amber) / 2 / RATE
    assert seconds > 1.0 and np.abs(np.frombuffer(amber, "<i2")).max() > 10_000
    assert pcm(sdk) == amber  # the same text and voice: the same audio
    cedar = pcm(sdk, voice="cedar")
    assert len(cedar) == len(amber) and cedar != amber
    assert pcm(sdk, voice={"id": "birch"}) not in (amber, cedar)  # OpenAI's object form of a voice
    assert abs(len(pcm(sdk, speed=2.0)) - len(amber) / 2) <= 3 * 2 * 256 * len(SENTENCES)
    assert pcm(sdk, "Something else entirely.") != amber[: len(pcm(sdk, "Something else entirely."))]

    # Every format decodes to the voice's speech.
    for response_format in FORMATS:
        encoded = sdk.audio.speech.create(model=MODEL, input=TEXT, voice="amber", response_format=response_format)
        rate, channels, duration = decoded(encoded.content, response_format)
        assert (rate, channels) == (EXPECTED_RATE.get(response_format, RATE), 1), response_format
        assert abs(duration - seconds) <= 0.15, (response_format, duration, seconds)

    # Streamed: each sentence leaves as its own piece of the chunked body. A piece never
    # spans two of the server's writes, so the first sentence's length is a piece boundary,
    # and the body up to it is that sentence spoken alone: it left before the rest.
    first_alone = pcm(sdk, SENTENCES[0])
    with sdk.audio.speech.with_streaming_response.create(model=MODEL, input=TEXT, voice="amber",
                                                         response_format="pcm") as streamed:
        pieces = list(streamed.iter_bytes())
    assert b"".join(pieces) == amber
    boundaries = set(np.cumsum([len(p) for p in pieces]).tolist())
    assert len(first_alone) in boundaries and len(first_alone) < len(amber)
    assert amber[: len(first_alone)] == first_alone
    with sdk.audio.speech.with_streaming_response.create(model=MODEL, input=TEXT, voice="amber",
                                                         response_format="mp3") as streamed:
        mp3 = b"".join(streamed.iter_bytes())
    assert abs(decoded(mp3, "mp3")[2] - seconds) <= 0.15

    # OpenAI's SSE form: one delta per sentence, then done with the usage.
    with sdk.audio.speech.with_streaming_response.create(model=MODEL, input=TEXT, voice="amber",
                                                         response_format="pcm", stream_format="sse") as events:
        lines = [line for line in events.iter_lines() if line.startswith("data: ")]
    parsed = [json.loads(line[len("data: "):]) for line in lines]
    deltas = [e for e in parsed if e["type"] == "speech.audio.delta"]
    assert len(deltas) == len(SENTENCES) and parsed[-1]["type"] == "speech.audio.done"
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == amber
    assert parsed[-1]["usage"]["input_tokens"] == len(TEXT)

    # Refusals: typed 400s in OpenAI's shape, naming what to fix; the voice goes on speaking.
    def refused(**fields) -> openai.BadRequestError:
        request = {"model": MODEL, "input": "Hello.", "voice": "amber", **fields}
        with pytest.raises(openai.BadRequestError) as error:
            sdk.audio.speech.create(**request)
        return error.value

    assert refused(input="").param == "input"
    assert refused(input="x" * 4097).code == "input_too_long"
    unknown = refused(voice="nobody")
    assert unknown.code == "unknown_voice" and "amber, birch, cedar" in unknown.message
    assert refused(response_format="ogg").param == "response_format"
    assert refused(speed=4.5).param == "speed" and refused(speed=0.1).param == "speed"
    assert refused(stream_format="websocket").param == "stream_format"
    assert refused(instructions="Speak like a pirate.").param == "instructions"
    assert refused(model="local/tiny-llama-gguf").code == "model_cannot_speak"
    with pytest.raises(openai.NotFoundError):
        sdk.audio.speech.create(model="local/not-a-model", input="Hello.", voice="amber")
    assert pcm(sdk) == amber

    # The text spoken is nowhere a node keeps things, nor in its log or State.
    for node in (a, b):
        assert SECRET.encode() not in node.get("/state").content
        paths = [*files_under(node.data_dir), node.log_path]
        for path in paths:
            assert SECRET.encode() not in path.read_bytes(), f"the spoken text in {path}"
