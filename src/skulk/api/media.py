"""Images on a chat request: the bounds, and the pure checks every wire format's adapter
applies to turn an image part into a checked `ImageInput` (docs/VISION.md).

An adapter hands this module what the caller sent for one image (a `data:` URL, an http(s)
URL the route has already fetched, or a base64 string) and gets back an `ImageInput` or a
typed 400 naming the field: the type is sniffed from the bytes' magic (never the declared
type), the size and pixel count are bounded, and the dimensions come from the header alone
(Pillow's `Image.open` reads the header; no pixel is decoded, so a PNG declaring
50000x50000 is refused before it costs memory). `check_request` bounds a whole request
(image count, total bytes, markers matching images).

Pure: this module never reads a socket or the clock. Fetching an URL is
`skulk.api.image_fetch`'s; the routes call it and pass the bytes in.

Errors (a 400 in the caller's shape; `ImageRefused`'s `code` tells them apart):

    ImageRefused (InvalidRequest)
    ├── image_too_large        an image above MAX_IMAGE_BYTES, or pixels above MAX_IMAGE_PIXELS
    ├── images_too_large       a request's images above MAX_REQUEST_IMAGE_BYTES in all
    ├── too_many_images        more than MAX_IMAGES_PER_REQUEST
    ├── unsupported_image_type bytes that are not PNG, JPEG, WebP or GIF
    ├── invalid_image          a bad data: URL, bad base64, a header that does not decode
    ├── image_url_refused      a scheme other than data:/http(s) (and `image_fetch`'s refusals)
    ├── image_marker_in_text   caller text holding IMAGE_MARKER
    └── unsupported_image_detail  `detail` low/high, which no engine honours yet
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Mapping, Sequence
from typing import Final, Literal, cast, get_args

from skulk.api.errors import ImageRefused, ModelCannotSee
from skulk.shared.body_limits import MAX_MAX_BODY_BYTES
from skulk.shared.input_transfer import MAX_COMMAND_INPUT_BYTES
from skulk.shared.types.cards import ModelCard, backend_engine
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.engines import sees_images
from skulk.shared.types.media import IMAGE_MARKER, ImageInput, ImageMediaType

MAX_IMAGE_BYTES: Final = 20 * 1024 * 1024
"""One image file's bytes (OpenAI's own per-image limit is 20 MB); a fetched body is cut off
at this many bytes and refused."""

MAX_REQUEST_IMAGE_BYTES: Final = 32 * 1024 * 1024
"""All images of one request together: the data plane's per-command vision bound (32 MiB,
as the cluster admits one command's media). Inline (base64) images also count against the
body bound (`api.max_body_bytes`, 8 MiB by default), so larger images come by URL or with a
raised body bound."""

assert (MAX_REQUEST_IMAGE_BYTES + 2) // 3 * 4 + MAX_MAX_BODY_BYTES < MAX_COMMAND_INPUT_BYTES, (
    "a request's images (base64) beside the largest body must fit one input transfer")

MAX_IMAGES_PER_REQUEST: Final = 16
"""Images in one request: each costs the engine an encoder pass and hundreds to thousands
of context tokens, so 16 already fills a small model's context."""

MAX_IMAGE_PIXELS: Final = 50_000_000
"""Pixels (width x height) of one image, read from its header before anything decodes it:
a decompression bomb (a tiny PNG declaring 50000x50000, 2.5 G pixels, 7.5 GB decoded) is
refused here, and the engine (which decodes and downsizes) never meets one. 50 MP is above
any phone camera's output."""

IMAGE_TOKENS_ESTIMATE: Final = 256
"""A conservative lower estimate of the prompt tokens one image costs, for the pre-bind
context check (`skulk.api.limits.context_error`) only: vision encoders spend 64 (Gemma 3 low
res, SmolVLM) to several thousand (Qwen2-VL at high res) tokens per image, so 256 never
refuses a request that could fit on common VLMs, while a request with many images is still
refused before it queues. The engine's real count comes back in `usage.prompt_tokens`."""

SERVED_DETAILS: Final[frozenset[str]] = frozenset({"auto"})
"""The OpenAI `detail` values some engine honours. No engine resizes per request yet, so
`low`/`high` are refused with a 400 naming `detail` rather than silently ignored; when an
engine honours them, add them here (the value is carried in `ImageInput.detail`)."""

Detail = Literal["auto", "low", "high"]

_MAGIC: Final[tuple[tuple[bytes, int, ImageMediaType], ...]] = (
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
)
"""(magic, offset, type): the file signatures of the served types. WebP is RIFF....WEBP
(`sniff` checks it apart)."""

_PIL_FORMATS: Final[Mapping[ImageMediaType, str]] = {
    "image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}

_DATA_URL = re.compile(r"data:(?P<type>[^;,]*)(?P<params>(?:;[^;,]*)*),(?P<data>.*)", re.DOTALL)


def sniff(data: bytes) -> ImageMediaType | None:
    """The image type `data` is, from its magic bytes; None for anything else."""
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for magic, offset, kind in _MAGIC if data[offset:offset + len(magic)] == magic), None)


def decode_base64(text: str, param: str) -> bytes:
    """Base64 (standard alphabet, padding optional, whitespace ignored) as bytes, or a 400
    naming `param`; a string too long to hold an image within `MAX_IMAGE_BYTES` is refused
    before it is decoded."""
    compact = "".join(text.split())
    if len(compact) * 3 // 4 > MAX_IMAGE_BYTES + 2:
        raise too_large(len(compact) * 3 // 4, param)
    try:
        return base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ImageRefused(f"'{param}' is not valid base64 image data.", param=param, code="invalid_image") from None


def parse_data_url(url: str, param: str) -> bytes:
    """The bytes of a `data:[<type>][;base64],<data>` URL, or a 400 naming `param`. Only
    base64 data is an image; the declared type is ignored (the bytes are sniffed)."""
    match = _DATA_URL.fullmatch(url)
    if match is None:
        raise ImageRefused(f"'{param}' is not a valid data: URL (expected data:image/...;base64,...).",
                             param=param, code="invalid_image")
    if "base64" not in [p.strip().lower() for p in match["params"].split(";")]:
        raise ImageRefused(f"'{param}': a data: URL image must be base64 (data:image/png;base64,...).",
                             param=param, code="invalid_image")
    return decode_base64(match["data"], param)


def too_large(size_bytes: int, param: str) -> ImageRefused:
    return ImageRefused(f"'{param}' is an image of {size_bytes} bytes; the limit is {MAX_IMAGE_BYTES} bytes.",
                          param=param, code="image_too_large")


def dimensions(data: bytes, media_type: ImageMediaType, param: str) -> tuple[int, int]:
    """(width, height) from the image's header, or a 400 naming `param`. Pillow is imported
    here, on the first image, so a node that never sees one never pays its import (~60 ms)."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        # formats=: the sniffed type's decoder only, so a file cannot pick another parser.
        # Pillow's own bomb check (a warning, or an error past twice its bound) is ours to
        # make: MAX_IMAGE_PIXELS below, with a message naming the field.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[_PIL_FORMATS[media_type]]) as image:
                width, height = image.size
    except Image.DecompressionBombError:
        raise ImageRefused(f"'{param}' declares more than {MAX_IMAGE_PIXELS} pixels; the limit is "
                             f"{MAX_IMAGE_PIXELS} pixels.", param=param, code="image_too_large") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise ImageRefused(f"'{param}' is not a decodable {media_type} image.", param=param,
                             code="invalid_image") from None
    if width < 1 or height < 1:
        raise ImageRefused(f"'{param}' declares an empty image ({width}x{height}).", param=param,
                             code="invalid_image")
    return width, height


def check_detail(detail: str | None, param: str) -> Detail:
    """OpenAI's `detail` as asked, refused unless some engine honours it (`SERVED_DETAILS`)."""
    value = detail or "auto"
    if value not in get_args(Detail):
        raise ImageRefused(f"'{param}' must be 'auto', 'low' or 'high', got {value!r}.", param=param)
    if value not in SERVED_DETAILS:
        raise ImageRefused(f"'{param}' {value!r} is not served: no engine resizes images per request; send "
                             "'auto' or leave it out.", param=param, code="unsupported_image_detail")
    return cast(Detail, value)


def image_input(data: bytes, param: str, detail: Detail = "auto") -> ImageInput:
    """The checked image `data`: bounded in bytes, sniffed, bounded in pixels from its
    header. A 400 naming `param` for each failure."""
    if len(data) > MAX_IMAGE_BYTES:
        raise too_large(len(data), param)
    media_type = sniff(data)
    if media_type is None:
        raise ImageRefused(f"'{param}' is not a PNG, JPEG, WebP or GIF image (judged from its bytes).",
                             param=param, code="unsupported_image_type")
    width, height = dimensions(data, media_type, param)
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageRefused(f"'{param}' is {width}x{height} pixels ({width * height}); the limit is "
                             f"{MAX_IMAGE_PIXELS} pixels.", param=param, code="image_too_large")
    return ImageInput.of(data, media_type, width, height, detail)


def is_fetched_url(url: str) -> bool:
    """Whether `url` is one the route fetches (http or https) rather than inline data."""
    return url[:8].lower().startswith(("http://", "https://"))


def image_from_url(url: str, fetched: Mapping[str, bytes], param: str, detail: Detail = "auto") -> ImageInput:
    """The image an `image_url`/`input_image`/Anthropic url source names: a `data:` URL's
    bytes, or an http(s) URL's body as the route fetched it (`fetched`); any other scheme
    is refused."""
    if url[:5].lower() == "data:":
        return image_input(parse_data_url(url, param), param, detail)
    if is_fetched_url(url):
        body = fetched.get(url)
        if body is None:  # the route fetches every URL `image_urls` found; this one it missed
            raise ImageRefused(f"'{param}' was not fetched.", param=param, code="image_url_refused")
        return image_input(body, param, detail)
    raise ImageRefused(f"'{param}' must be an https:// or data: URL.", param=param, code="image_url_refused")


def check_text(text: str | None, param: str) -> str | None:
    """`text` unless it holds `IMAGE_MARKER` (which only ever stands for an image): a 400
    naming `param` then."""
    if text is not None and IMAGE_MARKER in text:
        raise ImageRefused(f"'{param}' holds {IMAGE_MARKER!r}, which stands for an image here; remove it.",
                             param=param, code="image_marker_in_text")
    return text


def check_request(messages: Sequence[ChatMessage], prompt: str | None = None) -> ImageRefused | None:
    """The first bound the images of a normalised request break, or None: the count, the
    total bytes, and each message's markers matching its images (text holding a marker of
    its own, from any path, is refused here even where an adapter did not check)."""
    if prompt is not None and IMAGE_MARKER in prompt:
        return ImageRefused(f"'prompt' holds {IMAGE_MARKER!r}, which stands for an image here; remove it.",
                              param="prompt", code="image_marker_in_text")
    count = sum(len(m.images) for m in messages)
    if count > MAX_IMAGES_PER_REQUEST:
        return ImageRefused(f"The request holds {count} images; the limit is {MAX_IMAGES_PER_REQUEST}.",
                              param="messages", code="too_many_images")
    total = sum(len(image.data_b64) * 3 // 4 for m in messages for image in m.images)
    if total > MAX_REQUEST_IMAGE_BYTES:
        return ImageRefused(f"The request's images are {total} bytes in all; the limit is "
                              f"{MAX_REQUEST_IMAGE_BYTES} bytes.", param="messages", code="images_too_large")
    for index, message in enumerate(messages):
        if (message.content or "").count(IMAGE_MARKER) != len(message.images):
            return ImageRefused(f"'messages[{index}].content' holds {IMAGE_MARKER!r}, which stands for an image "
                                  "here; remove it.", param=f"messages[{index}].content", code="image_marker_in_text")
    return None


def image_count(messages: Sequence[ChatMessage]) -> int:
    return sum(len(m.images) for m in messages)


def card_sees(card: ModelCard | None) -> bool:
    """Whether a model can be sent images: its card says it sees (capability "vision") and
    an engine the card runs on serves images (`skulk.shared.types.engines.sees_images`)."""
    return card is not None and "vision" in card.capabilities and any(
        sees_images(backend_engine(tag), card.family) for tag in card.placement.compatible_backends)


def vision_refusal(model_id: str, card: ModelCard | None, param: str) -> ModelCannotSee | None:
    """The 400 for images sent to a model whose card does not say it sees, or None."""
    if card is not None and "vision" in card.capabilities:
        return None
    return ModelCannotSee(model_id, param=param)


__all__ = [
    "IMAGE_TOKENS_ESTIMATE",
    "MAX_IMAGES_PER_REQUEST",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "MAX_REQUEST_IMAGE_BYTES",
    "SERVED_DETAILS",
    "Detail",
    "card_sees",
    "check_detail",
    "check_request",
    "check_text",
    "decode_base64",
    "dimensions",
    "image_count",
    "image_from_url",
    "image_input",
    "is_fetched_url",
    "parse_data_url",
    "sniff",
    "too_large",
    "vision_refusal",
]
