"""What an uploaded audio file is, checked on the API node before any of it travels.

An upload's declared type and file name are hints a client may get wrong or lie about; the
bytes decide. `probe_audio` opens them with PyAV (FFmpeg) from memory, requires an audio
stream, and decodes it to count its samples: the duration it reports is measured, not read
from a header. The refusals, each a typed 400 in OpenAI's error shape (`AudioRefused`):

- `audio_invalid`: not an audio file FFmpeg can read (or no audio stream in it);
- `audio_empty`: an audio file with no samples;
- `audio_too_long`: longer than `MAX_AUDIO_SECONDS` (decoding stops there);
- `audio_too_large`: a file over `MAX_AUDIO_UPLOAD_BYTES` (a 413).

It never writes the audio anywhere and never logs it. Decoding is CPU work: callers run it
in a thread.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from skulk.api.errors import InvalidRequest, PayloadTooLarge
from skulk.shared.types.workload_io import MAX_AUDIO_UPLOAD_BYTES

MAX_AUDIO_SECONDS = 30 * 60
"""The longest audio one request transcribes: 30 minutes (a 25 MiB MP3 at 128 kbit/s is
about 27). Longer recordings are split by the caller; one request must not hold a runner
for an hour."""

MAX_PROBE_STREAMS = 16
"""Containers with more streams than this are not audio uploads (video with many tracks):
refused without decoding."""


class AudioRefused(InvalidRequest):
    """The uploaded file cannot be transcribed; `code` says why (module docstring)."""

    default_code = "audio_invalid"


@dataclass(frozen=True)
class AudioProbe:
    """What the upload holds: its measured duration, its first audio stream's rate and
    channels, and the codec and container FFmpeg found (not the declared type)."""

    duration_s: float
    sample_rate: int
    channels: int
    codec: str
    container: str


def size_refusal(size_bytes: int) -> PayloadTooLarge | None:
    """The refusal of a file of `size_bytes`, or None."""
    if size_bytes <= MAX_AUDIO_UPLOAD_BYTES:
        return None
    return PayloadTooLarge(f"The audio file is {size_bytes} bytes; at most {MAX_AUDIO_UPLOAD_BYTES} "
                           "(25 MiB) are transcribed in one request.", param="file", code="audio_too_large")


def probe_audio(data: bytes) -> AudioProbe:
    """The upload's audio, measured (raises `AudioRefused` or `PayloadTooLarge`)."""
    import av
    from av.error import FFmpegError

    too_large = size_refusal(len(data))
    if too_large is not None:
        raise too_large
    if not data:
        raise AudioRefused("The audio file is empty.", param="file", code="audio_empty")
    try:
        container = av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except (FFmpegError, ValueError, OSError, UnicodeDecodeError):
        raise AudioRefused("The file is not audio this node can read (FFmpeg found no known format in it).",
                           param="file") from None
    with container:
        streams = container.streams
        if len(streams) > MAX_PROBE_STREAMS:
            raise AudioRefused(f"The file holds {len(streams)} streams; an audio upload holds one.", param="file")
        if not streams.audio:
            raise AudioRefused(f"The file ({container.format.name}) holds no audio stream.", param="file")
        stream = streams.audio[0]
        rate = int(stream.codec_context.sample_rate or 0)
        samples = 0
        limit = MAX_AUDIO_SECONDS * rate if rate else None
        try:
            for frame in container.decode(stream):
                samples += frame.samples
                rate = rate or int(frame.sample_rate or 0)
                if limit is None and rate:
                    limit = MAX_AUDIO_SECONDS * rate
                if limit is not None and samples > limit:
                    raise AudioRefused(f"The audio is longer than {MAX_AUDIO_SECONDS // 60} minutes, the most one "
                                       "request transcribes; split it.", param="file", code="audio_too_long")
        except (FFmpegError, ValueError, OSError):
            raise AudioRefused("The audio stream does not decode (a damaged or truncated file).",
                               param="file") from None
        if samples == 0 or rate == 0:
            raise AudioRefused("The audio file holds no samples.", param="file", code="audio_empty")
        return AudioProbe(duration_s=samples / rate, sample_rate=rate, channels=int(stream.codec_context.channels or 1),
                          codec=str(stream.codec_context.name), container=str(container.format.name))


__all__ = ["MAX_AUDIO_SECONDS", "AudioProbe", "AudioRefused", "probe_audio", "size_refusal"]
