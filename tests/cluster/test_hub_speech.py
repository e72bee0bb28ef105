"""Speech repos on a (mock) Hugging Face hub, added the way a user adds them: `POST
/models/add` of a CTranslate2 Whisper repo (the generated tiny Whisper's files, as
faster-whisper's repos ship them) and of a multi-voice Piper repo with the voice named
(`onnxFile`), on a real node that builds the cards from the repos' files, downloads exactly
what each card names, and serves them through the OpenAI SDK."""

from __future__ import annotations

import io
import wave

import httpx
import openai
import pytest

from skulk.models.tiny_piper import write_tiny_piper
from skulk.models.tiny_whisper import write_tiny_whisper
from tests.mockhub import MockHub, serve
from tests.nodeproc import wait_for
from tests.speech_kit import silent_wav

pytestmark = pytest.mark.timeout(300)

WHISPER_REPO = "mock-org/faster-whisper-tiny"
PIPER_REPO = "mock-org/piper-voices"
VOICE = "en/en_US/tiny/x_low/en_US-tiny-x_low.onnx"
OTHER_VOICE = "de/de_DE/tiny/x_low/de_DE-tiny-x_low.onnx"


def _files(write, folder) -> dict[str, bytes]:
    folder.mkdir()
    write(folder)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_whisper_repo_and_a_piper_voice_are_added_from_the_hub_and_served(spawn_node, tmp_path):
    whisper = _files(write_tiny_whisper, tmp_path / "whisper")
    piper = _files(write_tiny_piper, tmp_path / "piper")
    hub = MockHub()
    hub.add_repo(WHISPER_REPO, {**whisper, "README.md": b"# tiny whisper\n"}, tags=("ctranslate2",))
    hub.add_repo(PIPER_REPO, {VOICE: piper["model.onnx"], f"{VOICE}.json": piper["model.onnx.json"],
                              OTHER_VOICE: piper["model.onnx"], f"{OTHER_VOICE}.json": piper["model.onnx.json"]},
                 tags=("onnx",))
    with serve(hub):
        node = spawn_node("speech", env={"HF_ENDPOINT": hub.url})
        node.wait_ready()
        wait_for(lambda: node.get("/v1/cluster").json().get("masterNodeId"), timeout_s=90, what="a master")

        def add(body: dict) -> dict:
            added = httpx.post(node.url + "/models/add", json=body, timeout=60)
            assert added.status_code == 200, added.text
            return added.json()["card"]

        heard = add({"modelId": WHISPER_REPO})
        assert heard["tasks"] == ["Transcription"] and heard["numLayers"] == 2 and heard["audio"]["sampleRate"] == 16000
        unnamed = httpx.post(node.url + "/models/add", json={"modelId": PIPER_REPO}, timeout=60)
        assert unnamed.status_code == 400 and "onnxFile" in unnamed.json()["detail"]
        spoken = add({"modelId": PIPER_REPO, "onnxFile": VOICE})
        assert spoken["onnxFile"] == VOICE and spoken["audio"]["voices"] == ["amber", "birch", "cedar"]

        for model in (WHISPER_REPO, PIPER_REPO):
            def placed(model=model):
                response = httpx.post(node.url + "/place_instance", json={"modelId": model}, timeout=10)
                return None if response.status_code in (404, 503) else response

            response = wait_for(placed, timeout_s=90, interval_s=0.5, what=f"{model} placed")
            assert response.status_code == 200, response.text

        sdk = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=120)

        def served(call):
            def attempt():
                try:
                    return call()
                except openai.APIStatusError as exc:
                    if exc.status_code == 503:  # still downloading or loading
                        return None
                    raise
            try:
                return wait_for(attempt, timeout_s=180, interval_s=1.0, what="the model serving")
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{node.log()[-6000:]}") from None

        audio = silent_wav(2.0)
        text = served(lambda: sdk.audio.transcriptions.create(model=WHISPER_REPO, file=("s.wav", audio, "audio/wav"),
                                                              response_format="verbose_json"))
        assert text.duration == pytest.approx(2.0, abs=0.05)
        speech = served(lambda: sdk.audio.speech.create(model=PIPER_REPO, input="hello there", voice="birch",
                                                        response_format="wav"))
        with wave.open(io.BytesIO(speech.content)) as reader:
            assert reader.getframerate() == 22050 and reader.getnframes() > 0
        # Exactly the named voice was fetched, not the repo's other one.
        fetched = {r.path.rsplit("/resolve/", 1)[-1] for r in hub.requests if "/resolve/" in r.path}
        assert any(p.endswith(VOICE) for p in fetched) and not any(p.endswith(OTHER_VOICE) for p in fetched)
