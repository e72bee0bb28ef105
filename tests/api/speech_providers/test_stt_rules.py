"""stt@'s pure input rule: options on the first chunk only, every bound typed."""

from __future__ import annotations

import base64

import pytest

from skulk.api.speech_providers.bounds import MAX_STT_AUDIO_BYTES, MAX_STT_CHUNK_BYTES, MAX_STT_CHUNKS
from skulk.api.speech_providers.stt import Gathered, gather
from skulk.extensions.providers.errors import CapabilityError


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_chunks_gather_in_order_with_first_chunk_options() -> None:
    got = gather(Gathered(), {"audio": _b64(b"ab"), "model": "m", "language": "en", "prompt": "p"})
    got = gather(got, {"audio": _b64(b"cd")})
    assert got == Gathered(audio=b"abcd", chunks=2, model="m", language="en", prompt="p")


@pytest.mark.parametrize(
    ("so_far", "value", "kind"),
    [
        (Gathered(), {"audio": "%%%"}, "input_invalid"),
        (Gathered(chunks=1), {"audio": "", "model": "m"}, "input_invalid"),  # options after the first
        (Gathered(chunks=1), {"audio": "", "language": "en"}, "input_invalid"),
        (Gathered(), {"audio": _b64(b"x" * (MAX_STT_CHUNK_BYTES + 1))}, "payload_too_large"),
        (Gathered(audio=b"x" * MAX_STT_AUDIO_BYTES, chunks=60), {"audio": _b64(b"x")}, "payload_too_large"),
        (Gathered(chunks=MAX_STT_CHUNKS), {"audio": ""}, "payload_too_large"),
    ],
)
def test_bad_input_is_typed(so_far, value, kind) -> None:
    with pytest.raises(CapabilityError) as failure:
        gather(so_far, value)
    assert failure.value.kind == kind
