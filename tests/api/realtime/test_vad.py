"""Silero VAD (`skulk.api.realtime.vad`) on real speech: espeak-ng says a sentence between
stretches of silence, and server VAD turn-taking finds exactly one turn around it."""

from __future__ import annotations

import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

from skulk.api.realtime import audio
from skulk.api.realtime.turns import WINDOW_MS, TurnSettings, TurnState, steps
from skulk.api.realtime.vad import VadStream

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                reason="espeak-ng (Debian package espeak-ng) makes the spoken test audio")


def spoken(tmp_path: Path, text: str) -> audio.Pcm:
    """`text` spoken by espeak-ng at 24 kHz, with 1 s of silence before and 1.5 s after."""
    path = tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    with wave.open(str(path)) as wav:
        samples = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.int16)
        rate = wav.getframerate()
    speech = audio.resample(samples, rate, audio.WIRE_RATE)
    return np.concatenate([np.zeros(24_000, np.int16), speech, np.zeros(36_000, np.int16)])


def probabilities(signal: audio.Pcm, chunk: int) -> list[float]:
    stream, carry, out = VadStream(), np.zeros(0, np.int16), []
    for at in range(0, signal.size, chunk):
        samples, carry = audio.downsample_24k_to_16k(carry, signal[at:at + chunk])
        out += stream.push(audio.to_float(samples))
    return out


def test_one_sentence_is_one_turn(tmp_path: Path) -> None:
    signal = spoken(tmp_path, "Hello there. This is a test of the voice activity detector.")
    speech_ms = (signal.size - 60_000) * 1000 // 24_000
    found = probabilities(signal, 480)  # 20 ms frames, as a client sends them
    assert len(found) == signal.size * 2 // 3 // 512
    _, events = steps(TurnSettings(), TurnState(), found)
    assert [e.kind for e in events] == ["speech_started", "speech_stopped"]
    started, stopped = events
    # the turn opens within the lead-in padding of where the speech is, and closes after it
    assert 1000 - 300 - 2 * WINDOW_MS <= started.ms <= 1000
    assert 1000 + speech_ms - 500 <= stopped.ms <= 1000 + speech_ms + 500 + 4 * WINDOW_MS


def test_chunking_does_not_change_the_probabilities(tmp_path: Path) -> None:
    signal = spoken(tmp_path, "Chunks.")
    assert probabilities(signal, 480) == pytest.approx(probabilities(signal, signal.size), abs=1e-5)


def test_silence_is_not_speech() -> None:
    assert max(VadStream().push(np.zeros(16_000, np.float32))) < 0.1
