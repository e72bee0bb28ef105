"""The dashboard's voice loop in a real browser (headless Chromium with a fake microphone
that plays an espeak-ng sentence) against a real node serving the generated speech models
(`local/tiny-whisper`, `local/tiny-piper`) and the tiny chat model: hands-free (server VAD)
the sentence is transcribed and answered, the answer's audio reaches the page; hold-to-talk
commits what was captured while the button was held and shows its transcript."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from skulk.api.realtime import audio
from tests.e2e.browser import open_page
from tests.e2e.test_openai_serving import place, wait_instance_ready
from tests.speech_kit import spoken_wav

pytest.importorskip("playwright")
from playwright.sync_api import expect

pytestmark = pytest.mark.timeout(600)

STT, TTS, CHAT = "local/tiny-whisper", "local/tiny-piper", "local/tiny-llama-gguf"
MIC_RATE = 48_000


def microphone_wav(tmp_path: Path) -> Path:
    """What the fake microphone plays, looped: 1 s of silence, a sentence, 6 s of silence
    (time for an answer before the sentence comes round again and barges in)."""
    spoken = tmp_path / "spoken.wav"
    spoken_wav("Hello there. What is the weather like today?", spoken)
    with wave.open(str(spoken)) as wav:
        samples = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.int16)
        rate = wav.getframerate()
    signal = np.concatenate([np.zeros(MIC_RATE, np.int16), audio.resample(samples, rate, MIC_RATE),
                             np.zeros(6 * MIC_RATE, np.int16)])
    out = tmp_path / "microphone.wav"
    out.write_bytes(audio.wav_bytes(signal, MIC_RATE))
    return out


def test_the_voice_loop_transcribes_and_answers_aloud(spawn_node, tmp_path):
    microphone = microphone_wav(tmp_path)
    node = spawn_node("voice")
    for model in (STT, CHAT, TTS):
        wait_instance_ready(node, place(node, modelId=model)["instanceId"], timeout_s=240)
    args = ("--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
            f"--use-file-for-fake-audio-capture={microphone}", "--autoplay-policy=no-user-gesture-required")
    with open_page("dashboard-voice", args=args) as browser:
        page = browser.page
        sent: list[str] = []
        page.on("websocket", lambda ws: ws.on("framesent", lambda frame: sent.append(str(frame))))
        page.goto(node.url + "/")
        page.click('nav [data-page="chat"]')
        expect(page.locator(f'[data-role="model"] option[value="{CHAT}"]')).to_have_count(1)
        page.select_option('[data-role="model"]', CHAT)
        expect(page.locator(f'[data-voice="stt"] option[value="{STT}"]')).to_have_count(1)
        expect(page.locator(f'[data-voice="tts"] option[value="{TTS}"]')).to_have_count(1)
        page.select_option('[data-voice="tts"]', TTS)

        # Hands-free: server VAD finds the sentence; it is transcribed, answered and spoken.
        page.check('[data-voice="vad"]')
        page.click('[data-voice="talk"]')
        expect(page.locator('[data-voice="heard"][data-state="done"]')).to_have_count(1)
        expect(page.locator('[data-voice="answer-text"][data-state="completed"]')).to_have_count(1)
        assert page.locator('[data-voice="answer-text"]').text_content()
        assert int(page.locator("skulk-voice").get_attribute("data-spoken") or "0") > 0
        assert not page.locator('[data-voice="error"]').text_content()
        browser.shot("voice-hands-free")
        page.click('[data-voice="talk"]')  # stop listening
        expect(page.locator('skulk-voice[data-state="idle"]')).to_have_count(1)

        # Hold to talk: held while two seconds of audio go out, then released: committed.
        page.uncheck('[data-voice="vad"]')
        page.uncheck('[data-voice="answer"]')
        page.evaluate("document.querySelector('[data-voice=\"heard\"]').removeAttribute('data-state')")
        before = len(sent)
        appended = "Number(document.querySelector('skulk-voice').dataset.appended || 0)"
        already = page.evaluate(appended)
        page.locator('[data-voice="talk"]').hover()
        page.mouse.down()
        page.wait_for_function(f"{appended} >= {already + 20}")  # two seconds of microphone audio sent
        page.mouse.up()
        expect(page.locator('[data-voice="heard"][data-state="done"]')).to_have_count(1)
        assert any("input_audio_buffer.commit" in f for f in sent[before:])
        assert not page.locator('[data-voice="error"]').text_content()
        assert not browser.errors, browser.errors
