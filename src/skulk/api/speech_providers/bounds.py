"""Every bound of the first-party speech providers (vad@, stt@, tts@), named and documented once.

The fabric's own bounds (call deadline, 1 MiB per chunk, 64 queued frames per direction) are
`skulk.extensions.providers.bounds`; these are the speech-specific ones inside them.
"""

from __future__ import annotations

from typing import Final

from skulk.extensions.providers.bounds import MAX_CALL_TIMEOUT_S
from skulk.shared.types.workload_io import MAX_AUDIO_UPLOAD_BYTES

VAD_RATES: Final = (8_000, 16_000, 32_000, 48_000)
"""The PCM16 sample rates vad@ accepts (WebRTC's); each is taken to the classifier's 16 kHz
by whole-ratio resampling, so chunk boundaries never change the result."""

MAX_VAD_CHUNK_BYTES: Final = 256 * 1024
"""Largest PCM16 payload of one vad@ input chunk (8 s at 16 kHz; its base64 stays well under
the fabric's 1 MiB chunk cap)."""

MAX_VAD_AUDIO_S: Final = MAX_CALL_TIMEOUT_S
"""Most audio one vad@ call classifies: a call cannot outlast its 600 s deadline in real
time, and one fed faster than real time stops here (`payload_too_large`)."""

MAX_VAD_UTTERANCE_MS: Final = 120_000
"""Largest `maxUtteranceMs` a caller may set (the default is the realtime edge's 30 s)."""
MAX_VAD_SILENCE_MS: Final = 10_000
"""Largest `silenceMs` hangover a caller may set."""
MAX_VAD_MIN_SPEECH_MS: Final = 5_000
"""Largest `minSpeechMs` a caller may set."""
MAX_VAD_PREROLL_MS: Final = 5_000
"""Largest `prefixPaddingMs` (preroll) a caller may set."""

MAX_STT_AUDIO_BYTES: Final = MAX_AUDIO_UPLOAD_BYTES
"""Most encoded audio one stt@ call takes, all chunks together: the transcription route's
own upload bound (25 MiB)."""

MAX_STT_CHUNK_BYTES: Final = 512 * 1024
"""Largest encoded audio of one stt@ input chunk (its base64 is under the 1 MiB chunk cap)."""

MAX_STT_CHUNKS: Final = 1024
"""Most input chunks one stt@ call takes (with the byte bound, a call cannot be kept open by
a flood of empty chunks)."""

MAX_TTS_FRAME_BYTES: Final = 256 * 1024
"""Largest MP3 payload of one tts@ output chunk; a longer encoded piece leaves as several
(its base64 stays under the 1 MiB chunk cap)."""


def b64_chars(size_bytes: int) -> int:
    """The base64 length of `size_bytes` bytes (the schema's maxLength for them)."""
    return (size_bytes + 2) // 3 * 4


__all__ = [
    "MAX_PENDING_UTTERANCES",
    "MAX_STT_AUDIO_BYTES",
    "MAX_STT_CHUNKS",
    "MAX_STT_CHUNK_BYTES",
    "MAX_TTS_FRAME_BYTES",
    "MAX_VAD_AUDIO_S",
    "MAX_VAD_CHUNK_BYTES",
    "MAX_VAD_MIN_SPEECH_MS",
    "MAX_VAD_PREROLL_MS",
    "MAX_VAD_SILENCE_MS",
    "MAX_VAD_UTTERANCE_MS",
    "VAD_RATES",
    "b64_chars",
]

MAX_PENDING_UTTERANCES: Final = 4
"""Committed stt.realtime@ utterances waiting for their transcription; one more ends the call
`overloaded` (the model cannot keep up with the speaker)."""
