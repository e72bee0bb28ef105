"""Speech encoding on the API node (`skulk.api.audio_encode`): every response format, whole
and streamed piece by piece, decodes back (with PyAV, and with soundfile where libsndfile reads
the format) to the right rate, one channel and about the right duration; streamed, audio
leaves with the first piece rather than at the end."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile

from skulk.api.audio_encode import FORMATS, UNKNOWN_LENGTH, encode_whole, encoder, pcm_headers, wav_header

RATE = 22050
SECONDS = 3.0
PIECES = 3
"""The PCM arrives as three 'sentences' of a second each."""


def tone(seconds: float = SECONDS, rate: int = RATE) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 330 * t) * 0.5 * 32767).astype("<i2").tobytes()


def decoded(body: bytes, response_format: str) -> tuple[int, int, float]:
    """(rate, channels, seconds) of an encoded body, decoded by FFmpeg (PyAV)."""
    if response_format == "pcm":
        return RATE, 1, len(body) / 2 / RATE
    import av

    with av.open(io.BytesIO(body), mode="r") as container:
        stream = container.streams.audio[0]
        frames = list(container.decode(stream))
    return frames[0].sample_rate, stream.codec_context.channels, sum(f.samples for f in frames) / frames[0].sample_rate


EXPECTED_RATE = {"opus": 48_000}
"""The rate a decoder gives: Opus always decodes at 48 kHz (it was encoded at 24 kHz)."""
SOUNDFILE_READS = {"wav", "flac", "mp3", "opus"}
"""What libsndfile also reads whole (not ADTS AAC; raw PCM has no header to read)."""
TOLERANCE_S = 0.1
"""Codec priming and padding: an encoder adds up to a few frames (AAC's 1024-sample priming, a
LAME frame of 1152 samples) that a streamed file has no header to trim."""


@pytest.mark.parametrize("response_format", sorted(FORMATS))
def test_a_whole_body_decodes_to_the_speech(response_format):
    body = encode_whole(response_format, tone(), RATE)
    rate, channels, seconds = decoded(body, response_format)
    assert (rate, channels) == (EXPECTED_RATE.get(response_format, RATE), 1)
    assert abs(seconds - SECONDS) <= TOLERANCE_S
    if response_format in SOUNDFILE_READS:
        data, sf_rate = soundfile.read(io.BytesIO(body))
        assert data.ndim == 1 and abs(len(data) / sf_rate - SECONDS) <= TOLERANCE_S


@pytest.mark.parametrize("response_format", sorted(FORMATS))
def test_a_streamed_body_leaves_with_the_first_piece_and_decodes_to_the_speech(response_format):
    pcm = tone()
    step = len(pcm) // PIECES
    one = encoder(response_format, RATE, streamed=True)
    pieces = [one.push(pcm[i * step:(i + 1) * step]) for i in range(PIECES)] + [one.finish()]
    assert pieces[0], "nothing left with the first sentence"
    body = b"".join(pieces)
    rate, channels, seconds = decoded(body, response_format)
    assert (rate, channels) == (EXPECTED_RATE.get(response_format, RATE), 1)
    assert abs(seconds - SECONDS) <= TOLERANCE_S
    assert one.finish() == b""  # finished once


def test_a_streamed_wav_declares_unknown_lengths_and_still_reads():
    one = encoder("wav", RATE, streamed=True)
    body = one.push(tone(1.0)) + one.finish()
    assert struct.unpack("<I", body[4:8])[0] == UNKNOWN_LENGTH == struct.unpack("<I", body[40:44])[0]
    data, rate = soundfile.read(io.BytesIO(body))
    assert rate == RATE and len(data) == RATE


def test_a_whole_wav_header_states_its_length():
    assert wav_header(RATE, 100)[40:44] == struct.pack("<I", 100) and len(wav_header(RATE, 100)) == 44
    with pytest.raises(ValueError):
        encoder("wav", RATE, streamed=False)


def test_pcm_is_the_samples_as_they_are_with_headers_that_describe_them():
    pcm = tone(0.5)
    assert encode_whole("pcm", pcm, RATE) == pcm
    assert pcm_headers(RATE) == {"X-Sample-Rate": "22050", "X-Channels": "1", "X-Sample-Format": "s16le"}


def test_no_samples_is_a_valid_empty_body():
    for response_format in FORMATS:
        encode_whole(response_format, b"", RATE)  # no raise: an encoder with nothing to say
