"""PCM arithmetic (`skulk.api.realtime.audio`)."""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
import pytest

from skulk.api.realtime import audio


def pcm(*values: int) -> audio.Pcm:
    return np.array(values, dtype=np.int16)


@pytest.mark.parametrize(("text", "expected"), [
    (base64.b64encode(b"\x01\x00\xff\x7f").decode(), b"\x01\x00\xff\x7f"),
    ("", b""),
])
def test_decode(text: str, expected: bytes) -> None:
    assert audio.decode_pcm16(text) == expected


@pytest.mark.parametrize("text", ["not base64!", base64.b64encode(b"\x01\x02\x03").decode()])
def test_decode_refuses(text: str) -> None:
    with pytest.raises(audio.BadAudio):
        audio.decode_pcm16(text)


@pytest.mark.parametrize(("samples", "out", "carry"), [
    (pcm(0, 10, 20, 30, 40, 50), pcm(0, 15, 30, 45), pcm()),
    (pcm(0, 10, 20, 30), pcm(0, 15), pcm(30)),
    (pcm(32767, 32767, 32767), pcm(32767, 32767), pcm()),
    (pcm(-32768, -32768, -32767), pcm(-32768, -32768), pcm()),
])
def test_downsample(samples: audio.Pcm, out: audio.Pcm, carry: audio.Pcm) -> None:
    got, left = audio.downsample_24k_to_16k(pcm(), samples)
    assert got.tolist() == out.tolist() and left.tolist() == carry.tolist()


def test_downsample_does_not_see_chunk_boundaries() -> None:
    signal = (np.sin(np.arange(24_000) / 7.0) * 12_000).astype(np.int16)
    whole, _ = audio.downsample_24k_to_16k(pcm(), signal)
    parts, carry = [], pcm()
    for cut in range(0, signal.size, 479):  # a chunk size prime to 3
        out, carry = audio.downsample_24k_to_16k(carry, signal[cut:cut + 479])
        parts.append(out)
    assert np.array_equal(np.concatenate(parts), whole) and whole.size == 16_000


@pytest.mark.parametrize(("size", "rates", "expected"), [
    (24_000, (24_000, 16_000), 16_000),
    (22_050, (22_050, 24_000), 24_000),
    (16_000, (16_000, 16_000), 16_000),
    (0, (22_050, 24_000), 0),
])
def test_resample_length(size: int, rates: tuple[int, int], expected: int) -> None:
    assert audio.resample(np.zeros(size, dtype=np.int16), *rates).size == expected


def test_resample_keeps_a_tone() -> None:
    tone = (np.sin(2 * np.pi * 440 * np.arange(22_050) / 22_050) * 10_000).astype(np.int16)
    out = audio.resample(tone, 22_050, 24_000)
    expected = np.sin(2 * np.pi * 440 * np.arange(24_000) / 24_000) * 10_000
    assert np.abs(out - expected).max() < 200


def test_wav() -> None:
    data = audio.wav_bytes(pcm(1, -2, 3), 16_000)
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (16_000, 1, 2)
        assert np.frombuffer(wav.readframes(3), "<i2").tolist() == [1, -2, 3]
