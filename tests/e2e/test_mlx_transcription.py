"""Speech to text on mlx-whisper end to end on real nodes: the generated
`local/tiny-mlx-whisper` (a real Whisper in mlx-whisper's layout with random weights) placed
on node B, served by the mlx_whisper engine (MLX's CPU backend here, Metal on a Mac), asked
through node A with the official OpenAI SDK. Speech that espeak-ng spoke reaches the model
(the transcript's duration is the WAV's; two recordings give two texts), segments and word
timings come back, translation is served, and what the card does not declare (a streamed
transcript) is refused typed in OpenAI's shape."""

from __future__ import annotations

import warnings

import httpx
import openai
import pytest

pytest.importorskip("mlx_whisper", reason="mlx-whisper is not installed (the dev group installs it)")

from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.e2e.test_openai_serving import wait_instance_ready
from tests.nodeproc import wait_for
from tests.speech_kit import TINY_MLX_WHISPER as TINY
from tests.speech_kit import require_espeak, spoken_wav, wav_duration_s

pytestmark = pytest.mark.timeout(420)

def test_speech_through_node_a_is_transcribed_by_mlx_whisper_on_node_b(spawn_node, tmp_path):
    require_espeak()
    first = spoken_wav("hello world, this is a test of speech to text", tmp_path / "first.wav")
    second = spoken_wav("the quick brown fox jumps over the lazy dog", tmp_path / "second.wav")
    a, b = start_linked(spawn_node, ["mlxw-a", "mlxw-b"])
    wait_agreed([a, b], members=2)

    def placed() -> httpx.Response | None:
        response = httpx.post(a.url + "/place_instance", json={"modelId": TINY, "excludedNodes": [node_id(a)]},
                              timeout=10)
        return None if response.status_code == 503 else response

    response = wait_for(placed, timeout_s=90, interval_s=0.5, what="tiny-mlx-whisper placed")
    assert isinstance(response, httpx.Response) and response.status_code == 200, response
    body = wait_instance_ready(a, response.json()["instanceId"], timeout_s=240)
    assert {s["nodeId"] for s in body["shards"]} == {node_id(b)}
    assert all(s["backend"].startswith("mlx_whisper") for s in body["shards"])

    sdk = openai.OpenAI(base_url=a.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    transcribe = sdk.audio.transcriptions.create

    one = transcribe(model=TINY, file=("first.wav", first, "audio/wav"), response_format="verbose_json",
                     language="en")
    two = transcribe(model=TINY, file=("second.wav", second), response_format="verbose_json", language="en")
    assert one.duration == pytest.approx(wav_duration_s(first), abs=0.01)
    assert two.duration == pytest.approx(wav_duration_s(second), abs=0.01)
    assert one.text and two.text and one.text != two.text
    assert one.language == "en" and one.segments and 0 <= one.segments[0].start <= one.segments[0].end
    assert transcribe(model=TINY, file=("first.wav", first), language="en").text == one.text  # greedy at 0

    worded = transcribe(model=TINY, file=("first.wav", first), response_format="verbose_json",
                        timestamp_granularities=["word", "segment"], language="en", prompt="Skulk")
    assert worded.words and all(0 <= w.start <= w.end for w in worded.words)

    with warnings.catch_warnings():  # the SDK marks translations deprecated; OpenAI still serves them
        warnings.simplefilter("ignore", DeprecationWarning)
        translated = sdk.audio.translations.create(model=TINY, file=("first.wav", first))
    assert translated.text

    with pytest.raises(openai.BadRequestError) as caught:
        list(transcribe(model=TINY, file=("second.wav", second), stream=True))
    assert caught.value.code == "streaming_unsupported"
    with pytest.raises(openai.BadRequestError) as caught:
        transcribe(model=TINY, file=("notes.wav", b"these are words, not audio" * 40))
    assert caught.value.code == "audio_invalid"
    assert transcribe(model=TINY, file=("first.wav", first), language="en").text == one.text  # serves on
