"""PCM arithmetic for realtime voice: the wire's base64 PCM16 decoded, 24 kHz audio taken to
the 16 kHz the VAD and Whisper hear (incrementally, chunk boundaries invisible), any rate to
any rate for whole clips, and a clip wrapped as a WAV file for a transcription request.

Pure functions over bytes and numpy arrays; nothing here reads a clock or touches a file.
"""

from __future__ import annotations

import base64
import binascii
import io
import wave

import numpy as np
import numpy.typing as npt

WIRE_RATE = 24_000
"""The sample rate of realtime audio in both directions (OpenAI's `pcm16`: 24 kHz mono)."""
VAD_RATE = 16_000
"""The rate the VAD classifies and Whisper hears."""

Pcm = npt.NDArray[np.int16]


class BadAudio(ValueError):
    """Appended audio that is not base64 PCM16 (odd byte count, bad base64)."""


def decode_pcm16(audio_b64: str) -> bytes:
    """The PCM16 bytes of a base64 `audio` field (`BadAudio` when it is not)."""
    try:
        data = base64.b64decode(audio_b64, validate=True)
    except (binascii.Error, ValueError):
        raise BadAudio("'audio' is not valid base64") from None
    if len(data) % 2:
        raise BadAudio(f"'audio' decodes to {len(data)} bytes; PCM16 samples are 2 bytes each")
    return data


def pcm_of(data: bytes) -> Pcm:
    return np.frombuffer(data, dtype="<i2").astype(np.int16)


def downsample_24k_to_16k(carry: Pcm, chunk: Pcm) -> tuple[Pcm, Pcm]:
    """`chunk` (after the `carry` left over from the last call) at 16 kHz, and the new carry.

    24 kHz to 16 kHz is 3 samples to 2: each block of three gives its first sample and the
    mean of the other two (linear interpolation at 0, 1.5), which also damps the band the
    lower rate cannot hold. Whole blocks only, so cutting the stream anywhere gives the
    same output as one call over all of it."""
    samples = np.concatenate([carry, chunk]) if carry.size else chunk
    whole = samples.size - samples.size % 3
    blocks = samples[:whole].astype(np.int32).reshape(-1, 3)
    out = np.empty((blocks.shape[0], 2), dtype=np.int32)
    out[:, 0] = blocks[:, 0]
    out[:, 1] = (blocks[:, 1] + blocks[:, 2]) // 2
    return out.reshape(-1).astype(np.int16), samples[whole:].copy()


def resample(samples: Pcm, from_rate: int, to_rate: int) -> Pcm:
    """A whole clip at another rate (linear interpolation; the identity when the rates are
    equal). The output has round(len * to_rate / from_rate) samples."""
    if from_rate == to_rate or samples.size == 0:
        return samples.copy()
    count = round(samples.size * to_rate / from_rate)
    positions = np.arange(count, dtype=np.float64) * (from_rate / to_rate)
    out = np.interp(positions, np.arange(samples.size, dtype=np.float64), samples.astype(np.float64))
    return np.clip(np.rint(out), -32768, 32767).astype(np.int16)


def to_float(samples: Pcm) -> npt.NDArray[np.float32]:
    """PCM16 as float32 in [-1, 1), what the VAD takes."""
    return samples.astype(np.float32) / 32768.0


def wav_bytes(samples: Pcm, rate: int) -> bytes:
    """A mono 16-bit WAV file holding `samples` at `rate`."""
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()


def ms_of(samples: int, rate: int = WIRE_RATE) -> int:
    return samples * 1000 // rate


def samples_of(ms: int, rate: int = WIRE_RATE) -> int:
    return ms * rate // 1000


__all__ = ["VAD_RATE", "WIRE_RATE", "BadAudio", "Pcm", "decode_pcm16", "downsample_24k_to_16k", "ms_of", "pcm_of",
           "resample", "samples_of", "to_float", "wav_bytes"]
