"""The request body-size bounds: the default and the range an operator may set.

They live here, not in `skulk.api.limits` (which applies them), because the node's config
(`skulk.datadir.config`, `api.max_body_bytes`) validates the setting against the same range:
a data-dir module must not import the API. Constants only.
"""

from __future__ import annotations

from typing import Final

DEFAULT_MAX_BODY_BYTES: Final = 8 * 1024 * 1024
"""Default request body limit (8 MiB; `api.max_body_bytes` in skulk.yaml, env
`SKULK_API_MAX_BODY_BYTES`). Sized for text: a full 1M-token context
is about 4 MB of text, so 8 MiB holds the largest context we serve with room for JSON
escaping, while a 50 MB body (25 s and ~4 GB of memory to refuse before) is refused from its
Content-Length without reading a byte. Inline (base64) images count against it too; larger
images come by URL (docs/VISION.md)."""

MIN_MAX_BODY_BYTES: Final = 64 * 1024
"""The smallest limit an operator may set: below it, ordinary chats would be refused."""

MAX_MAX_BODY_BYTES: Final = 32 * 1024 * 1024
"""The largest limit an operator may set: a request travels to the master as one control
message, and the transport admits control messages up to 64 MiB (routing/topics.py)."""

MULTIPART_OVERHEAD_BYTES: Final = 64 * 1024
"""Room for a multipart form's other fields and boundaries beside its file (a transcription
prompt is at most 4096 characters; the rest are short)."""

AUDIO_UPLOAD_PATHS: Final = ("/v1/audio/transcriptions", "/v1/audio/translations")
"""The routes that take an audio upload: their bodies are bounded by `audio_body_bytes`
instead of the node's body limit (an upload is not text, and travels to the serving node on
the data plane, not to the master)."""


def audio_body_bytes(max_audio_upload_bytes: int) -> int:
    """The body limit of an audio upload route: the largest file plus the form around it."""
    return max_audio_upload_bytes + MULTIPART_OVERHEAD_BYTES


__all__ = [
    "AUDIO_UPLOAD_PATHS",
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_MAX_BODY_BYTES",
    "MIN_MAX_BODY_BYTES",
    "MULTIPART_OVERHEAD_BYTES",
    "audio_body_bytes",
]
