"""Images a chat message carries to a model that sees (issue: vision).

An adapter turns every wire format's image parts (OpenAI `image_url`, Responses
`input_image`, Anthropic `image` blocks, Ollama `images`) into `ImageInput`s on the message,
in order, and writes `IMAGE_MARKER` into the message's text where each image stood (Ollama's
images, which have no position, go first). An engine renders the chat template over that
text and puts each image's embedding where its marker is, in order.

The bytes are the image file as sent (PNG, JPEG, WebP or GIF), checked by the API node (type
sniffed from the bytes, size and pixel bounds) and decoded again, bounded, by the engine.
They travel only in a request's full params on the data plane (`TaskInput`), never in
State or the event log: `TextGenerationParams.redacted` drops them. Pure data.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Final, Literal

from pydantic import Field

from skulk.shared.types.base import WireModel

IMAGE_MARKER: Final = "<|skulk-image|>"
"""Where an image stands in a message's text. Caller text that contains it is refused (a 400
naming the field), so a marker is always an image."""

ImageMediaType = Literal["image/png", "image/jpeg", "image/webp", "image/gif"]


class ImageInput(WireModel):
    """One image of a message: its encoded bytes (base64, as every wire form carries them) and
    what the API node found when it checked them."""

    data_b64: str = Field(repr=False, min_length=1)
    media_type: ImageMediaType
    width: int = Field(ge=1)
    height: int = Field(ge=1)
    sha256: str = Field(min_length=64, max_length=64)
    """Hex digest of `data`: the prefix cache keys an image by it, and a transfer is checked
    against it."""
    detail: Literal["auto", "low", "high"] = "auto"
    """OpenAI's `detail`, as asked; engines that cannot honour low/high refuse it at the API."""

    @property
    def data(self) -> bytes:
        """The image file's bytes."""
        return base64.b64decode(self.data_b64, validate=True)

    def digest_error(self) -> str | None:
        """Why these bytes are not the image the API node checked (not base64, or another
        SHA-256), or None. The serving node asks before an engine sees them: an engine keys
        its prefix cache by the digest, so a wrong one would reuse another image's KV."""
        try:
            data = self.data
        except ValueError as exc:
            return f"an image is not valid base64 ({exc})"
        if hashlib.sha256(data).hexdigest() != self.sha256:
            return "an image's SHA-256 differs from the one the API node computed"
        return None

    @classmethod
    def of(cls, data: bytes, media_type: ImageMediaType, width: int, height: int,
           detail: Literal["auto", "low", "high"] = "auto") -> ImageInput:
        """The checked image `data` (the digest computed here)."""
        return cls(data_b64=base64.b64encode(data).decode("ascii"), media_type=media_type, width=width,
                   height=height, sha256=hashlib.sha256(data).hexdigest(), detail=detail)


__all__ = ["IMAGE_MARKER", "ImageInput", "ImageMediaType"]
