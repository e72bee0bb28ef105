"""Speech audio on the API node: the runner's mono PCM16 turned into the format the caller
asked for (`response_format` of `POST /v1/audio/speech`), whole or piece by piece as the
runner's sentences arrive.

Formats, each a row of `FORMATS`:
- `pcm`: the runner's samples as they are (signed 16-bit little-endian, mono, at the card's
  rate), described by headers (`pcm_headers`) since the bytes carry no header;
- `wav`: a 44-byte RIFF header and the same samples; streamed, the header declares unknown
  lengths (0xFFFFFFFF), as OpenAI's streamed WAV does, since the length is not known yet;
- `mp3` (LAME), `opus` (libopus in Ogg, resampled to 24 kHz: Opus takes no 22.05 kHz),
  `aac` (FFmpeg's AAC in ADTS frames) and `flac` (FFmpeg's FLAC): encoded by PyAV, the
  FFmpeg its wheel bundles. Each container here can be written front to back without seeking,
  so every format can stream; a whole FLAC's header also carries its length and checksum,
  which is why the speech route always sends FLAC whole (`routes.speech.WHOLE_ONLY_FORMATS`).

PyAV over soundfile: soundfile (libsndfile) writes WAV, FLAC, Ogg/Opus and MP3 too, but
through a seekable file whose header it completes on close, and has no AAC; PyAV muxes front
to back into a byte sink as frames are encoded, which is what streaming needs. Measured on this project's 2-core machine, encoding 10 s of 22.05 kHz mono
takes about 63 ms as MP3, 49 ms as Opus, 59 ms as AAC and 9 ms as FLAC (WAV and PCM: a
copy): small beside synthesis, so the API node encodes (off its event loop) and no runner does.

This module knows no HTTP and no model: PCM and a rate in, bytes out. It never writes a file.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Protocol

import numpy as np

AudioFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]

PCM_SAMPLE_FORMAT = "s16le"
"""What `pcm` carries (the value of its `X-Sample-Format` header)."""

UNKNOWN_LENGTH = 0xFFFFFFFF
"""A streamed WAV header's RIFF and data sizes: the length is not known when it leaves."""


@dataclass(frozen=True)
class FormatSpec:
    """One response format: its media type, and for the PyAV-encoded ones the FFmpeg
    muxer, encoder, the rate the encoder must take (None: the PCM's own) and bit rate."""

    content_type: str
    muxer: str | None = None
    codec: str | None = None
    rate: int | None = None
    bit_rate: int | None = None
    muxer_options: tuple[tuple[str, str], ...] = ()


FORMATS: Mapping[AudioFormat, FormatSpec] = MappingProxyType({
    "mp3": FormatSpec("audio/mpeg", muxer="mp3", codec="libmp3lame", bit_rate=64_000),
    # Opus runs at 8/12/16/24/48 kHz; 24 kHz keeps a 22.05 kHz voice's whole band.
    # Ogg pages of at most 100 ms rather than FFmpeg's 1 s, so a streamed sentence leaves
    # with its own page instead of waiting for the next sentence's samples.
    "opus": FormatSpec("audio/ogg", muxer="ogg", codec="libopus", rate=24_000, bit_rate=32_000,
                       muxer_options=(("page_duration", "100000"),)),
    "aac": FormatSpec("audio/aac", muxer="adts", codec="aac", bit_rate=64_000),
    "flac": FormatSpec("audio/flac", muxer="flac", codec="flac"),
    "wav": FormatSpec("audio/wav"),
    "pcm": FormatSpec("audio/pcm"),
})
"""Every response format `POST /v1/audio/speech` serves, by OpenAI's name."""


def pcm_headers(sample_rate: int) -> dict[str, str]:
    """The headers that say how to read `pcm` bytes (they have no header of their own)."""
    return {"X-Sample-Rate": str(sample_rate), "X-Channels": "1", "X-Sample-Format": PCM_SAMPLE_FORMAT}


def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """A canonical 44-byte header for mono 16-bit PCM; `data_bytes` None: unknown (streamed)."""
    riff = UNKNOWN_LENGTH if data_bytes is None else 36 + data_bytes
    data = UNKNOWN_LENGTH if data_bytes is None else data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data))


class Encoder(Protocol):
    """Encodes one response: `push` each piece of PCM as it arrives and send what it
    returns (possibly nothing yet: an encoder holds samples until a frame is full); `finish`
    returns the rest."""

    def push(self, pcm: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


class _Raw:
    """pcm, and streamed wav: the samples as they come, after a header for wav."""

    def __init__(self, header: bytes) -> None:
        self._header = header

    def push(self, pcm: bytes) -> bytes:
        out, self._header = self._header + pcm, b""
        return out

    def finish(self) -> bytes:
        out, self._header = self._header, b""
        return out


class _Sink:
    """Where the muxer writes: bytes collected until drained. No `seek`: the muxer writes
    front to back, as it must for a body already on its way."""

    def __init__(self) -> None:
        self._data = bytearray()

    def write(self, data: Any) -> int:
        self._data += data
        return len(data)

    def drain(self) -> bytes:
        out = bytes(self._data)
        self._data.clear()
        return out


class _PyAv:
    """A PyAV encoder and muxer writing into a `_Sink` (streamed) or a `_WholeFile`, fed mono
    s16 frames; PyAV resamples each to the encoder's format, rate and frame size."""

    def __init__(self, spec: FormatSpec, sample_rate: int, *, streamed: bool) -> None:
        import av

        assert spec.muxer is not None and spec.codec is not None
        self._sink = _Sink() if streamed else None
        self._file = None if streamed else io.BytesIO()
        self._container: Any = av.open(self._sink if self._sink is not None else self._file, mode="w",
                                       format=spec.muxer, options=dict(spec.muxer_options))
        self._stream: Any = self._container.add_stream(spec.codec, rate=spec.rate or sample_rate, layout="mono")
        if spec.bit_rate is not None:
            self._stream.bit_rate = spec.bit_rate
        self._sample_rate = sample_rate
        self._pts = 0
        self._closed = False

    def push(self, pcm: bytes) -> bytes:
        import av

        samples = np.frombuffer(pcm, dtype="<i2")
        if samples.size:
            frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = self._sample_rate
            frame.pts = self._pts
            self._pts += samples.size
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._sink.drain() if self._sink is not None else b""

    def finish(self) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        # A whole body's muxer wrote into a seekable file, so a header that states the
        # length (FLAC's STREAMINFO) was completed at the end.
        return self._sink.drain() if self._sink is not None else (self._file.getvalue() if self._file else b"")


def encoder(response_format: AudioFormat, sample_rate: int, *, streamed: bool) -> Encoder:
    """An encoder for one response. `streamed`: pieces leave as they are pushed (a WAV's
    header declares unknown lengths); use `encode_whole` for a body encoded at once."""
    spec = FORMATS[response_format]
    if response_format == "pcm":
        return _Raw(b"")
    if response_format == "wav":
        if not streamed:
            raise ValueError("a whole WAV knows its length: use encode_whole")
        return _Raw(wav_header(sample_rate, None))
    return _PyAv(spec, sample_rate, streamed=streamed)


def encode_whole(response_format: AudioFormat, pcm: bytes, sample_rate: int) -> bytes:
    """All of `pcm` in `response_format`, as one body (a WAV header with its true length)."""
    if response_format == "wav":
        return wav_header(sample_rate, len(pcm)) + pcm
    one = encoder(response_format, sample_rate, streamed=False)
    return one.push(pcm) + one.finish()


__all__ = ["FORMATS", "PCM_SAMPLE_FORMAT", "UNKNOWN_LENGTH", "AudioFormat", "Encoder", "FormatSpec", "encode_whole",
           "encoder", "pcm_headers", "wav_header"]
