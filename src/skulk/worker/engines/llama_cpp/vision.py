"""The in-process llama.cpp engine's eyes: a card's projector (mmproj) driven through mtmd.

The engine renders and tokenizes its prompt itself (caller text never parsed as special
tokens) and runs its own token loop, so images are joined in at two points only:

- Tokenizing: each `IMAGE_MARKER` in the prompt's text becomes the tokens mtmd makes of
  that image (`ImageLayout`: mtmd's text tokens around it, if the model wants any, and one
  placeholder id per image embedding). A placeholder is a negative id, never a vocabulary
  token, derived from the image's SHA-256 (`image_tokens`), so the prompt's token list
  stands for its images: its length counts them (usage, the context check), and the prefix
  cache (hot context and cold store alike, both compare token lists) reuses KV only past an
  identical image at the identical position, never across images that differ.
- Evaluating: a prompt stretch that is an image (`image_spans`) is evaluated with mtmd's
  helper (the vision encoder, then the embeddings decoded at their positions); text is
  evaluated as before. A cached prefix that would end inside an image is cut back to the
  image's start (`reusable_prefix`).

A projector whose model numbers positions other than one per token (M-RoPE: Qwen2-VL and
kin) is not driven: `Eyes.open` says why, and the engine refuses images by name while it
goes on serving text. The pure functions are tested without a model. `Eyes` owns the mtmd
context; its lock serialises every mtmd call (a count-only request may learn an image's
layout while a generation evaluates another). This module never decides which KV to reuse
(the prefix store does) and never samples.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from skulk.shared.types.media import IMAGE_MARKER, ImageInput
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.worker.engines.base import EngineError, ModelLoadFailed
from skulk.worker.engines.prompt_pieces import Piece

T = TypeVar("T")

LAYOUT_CACHE_ENTRIES = 64
"""Image layouts kept by digest (a few small tuples each): a conversation re-sends its images
every turn, and a layout costs a decode and a preprocess of the image to learn."""


STB_DECODED_TYPES = frozenset({"image/png", "image/jpeg", "image/gif"})
"""The image types mtmd's own decoder (stb_image) reads from the file's bytes. The others the
API accepts (WebP) are decoded here with Pillow into RGB pixels first; the API node has
already bounded their pixels (50 MP)."""


class ImagesNotSeen(EngineError):
    """Images sent to an in-process llama.cpp engine that has no eyes for them (no projector,
    a pooled instance, a projector mtmd cannot drive here): refused by name."""

    error_type = StreamErrorType.INVALID_REQUEST


class ImageFailed(EngineError):
    """mtmd could not read or evaluate an image the API node accepted."""

    error_type = StreamErrorType.INVALID_REQUEST


@dataclass(frozen=True, slots=True)
class ImageLayout:
    """What mtmd makes of one image, in order: text tokens (a tuple of ids) and image chunks
    (an int: how many embeddings, one position each)."""

    parts: tuple[tuple[int, ...] | int, ...]

    @property
    def n_tokens(self) -> int:
        return sum(part if isinstance(part, int) else len(part) for part in self.parts)


@dataclass(frozen=True, slots=True)
class ImageSpan:
    """Where one image stands in a prompt's token list: [start, end)."""

    start: int
    end: int
    image: ImageInput


PLACEHOLDER_BITS = 31
"""Bits of the image's digest one placeholder carries: its ids are -1 .. -2**31 (llama-cpp-
python keeps token ids in int32)."""

PLACEHOLDER_PERIOD = -(-256 // PLACEHOLDER_BITS)
"""Placeholders that together carry the whole SHA-256 (9)."""


def image_tokens(sha256_hex: str, layout: ImageLayout) -> list[int]:
    """The image's stand-in tokens: its layout's text tokens as they are, and for each
    embedding a negative id carrying 31 bits of the image's digest (embedding i the
    (i mod 9)-th slice), so any 9 placeholders in a row carry the whole digest: two
    different images agree on no such run."""
    digest = int(sha256_hex, 16)
    mask = (1 << PLACEHOLDER_BITS) - 1
    slices = [(digest >> (PLACEHOLDER_BITS * i)) & mask for i in range(PLACEHOLDER_PERIOD)]
    tokens: list[int] = []
    embedding = 0
    for part in layout.parts:
        if isinstance(part, int):
            for _ in range(part):
                tokens.append(-1 - slices[embedding % PLACEHOLDER_PERIOD])
                embedding += 1
        else:
            tokens.extend(part)
    return tokens


def count_markers(pieces: Sequence[Piece]) -> int:
    return sum(piece.count(IMAGE_MARKER) for piece in pieces if isinstance(piece, str))


def place_images(pieces: Sequence[Piece], expansions: Sequence[Sequence[int]]) -> list[Piece]:
    """`pieces` with the i-th `IMAGE_MARKER` in their text replaced by `expansions[i]` (token
    ids). The counts must agree (`ImageFailed` otherwise: a template that dropped or
    repeated a message would put images where no caller put them)."""
    found = count_markers(pieces)
    if found != len(expansions):
        raise ImageFailed(f"the rendered prompt holds {found} image markers for {len(expansions)} images "
                          "(the chat template dropped or repeated a message with an image)")
    placed: list[Piece] = []
    index = 0
    for piece in pieces:
        if isinstance(piece, int) or IMAGE_MARKER not in piece:
            placed.append(piece)
            continue
        texts = piece.split(IMAGE_MARKER)
        for position, text in enumerate(texts):
            if text:
                placed.append(text)
            if position < len(texts) - 1:
                placed.extend(expansions[index])
                index += 1
    return placed


def image_spans(prompt: Sequence[int], expansions: Sequence[Sequence[int]],
                images: Sequence[ImageInput]) -> list[ImageSpan]:
    """Where each image's stand-in tokens (`expansions`, in order) stand in `prompt`. Every
    image has at least one placeholder (a negative id, never text), so each is found by its
    first placeholder after the previous image and checked whole."""
    spans: list[ImageSpan] = []
    cursor = 0
    for expansion, image in zip(expansions, images, strict=True):
        lead = next(i for i, token in enumerate(expansion) if token < 0)
        position = cursor + lead
        while position < len(prompt) and prompt[position] != expansion[lead]:
            position += 1
        start = position - lead
        if position >= len(prompt) or list(prompt[start : start + len(expansion)]) != list(expansion):
            raise ImageFailed("an image's tokens are not whole in the prompt")
        spans.append(ImageSpan(start, start + len(expansion), image))
        cursor = start + len(expansion)
    return spans


def reusable_prefix(cached: int, spans: Sequence[ImageSpan]) -> int:
    """`cached` prompt tokens already in the KV, cut back to the start of an image it ends
    inside: an image is evaluated whole or not at all."""
    for span in spans:
        if span.start < cached < span.end:
            return span.start
    return cached


class Eyes:
    """One mtmd context over a loaded `Llama`'s model. Close it before the model."""

    def __init__(self, mtmd: Any, ctx: Any) -> None:
        self._mtmd = mtmd
        self._ctx = ctx
        self._lock = threading.Lock()
        self._layouts: OrderedDict[str, ImageLayout] = OrderedDict()

    @classmethod
    def open(cls, llama: Any, projector: str, *, threads: int, use_gpu: bool, flash_attn: bool) -> Eyes | str:
        """Eyes over `projector`, or why this engine cannot see through it (a sentence)."""
        import llama_cpp
        import llama_cpp.mtmd_cpp as mtmd
        from llama_cpp._logger import llama_log_callback

        # The same quiet logging llama-cpp-python gives llama.cpp (errors only, unless verbose).
        mtmd.mtmd_log_set(llama_log_callback, ctypes.c_void_p(0))
        mtmd.mtmd_helper_log_set(llama_log_callback, ctypes.c_void_p(0))
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.print_timings = False
        params.n_threads = threads
        params.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                  else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        ctx = mtmd.mtmd_init_from_file(projector.encode(), llama.model, params)
        if ctx is None:
            raise ModelLoadFailed(f"mtmd could not load the projector {projector} with this model")
        eyes = cls(mtmd, ctx)
        if not mtmd.mtmd_support_vision(ctx):
            eyes.close()
            return f"the projector {projector} has no vision encoder"
        if mtmd.mtmd_decode_use_mrope(ctx):
            eyes.close()
            return ("its projector numbers image positions in 2D (M-RoPE), which the in-process llama.cpp "
                    "engine does not drive; serve it on llama_server")
        return eyes

    def close(self) -> None:
        with self._lock:
            ctx, self._ctx = self._ctx, None
            if ctx is not None:
                self._mtmd.mtmd_free(ctx)

    def layout(self, image: ImageInput) -> ImageLayout:
        """What mtmd makes of `image` (cached by digest)."""
        with self._lock:
            known = self._layouts.get(image.sha256)
            if known is not None:
                self._layouts.move_to_end(image.sha256)
                return known
            found = self._with_chunks(image, self._layout_of)
            self._layouts[image.sha256] = found
            while len(self._layouts) > LAYOUT_CACHE_ENTRIES:
                self._layouts.popitem(last=False)
            return found

    def evaluate(self, llama: Any, image: ImageInput, n_past: int, n_batch: int) -> int:
        """Evaluate `image` (mtmd's chunks for it, in order) into `llama`'s context at position
        `n_past`; the position after it."""
        import llama_cpp

        def run(chunks: Any) -> int:
            position = n_past
            for index in range(self._mtmd.mtmd_input_chunks_size(chunks)):
                chunk = self._mtmd.mtmd_input_chunks_get(chunks, index)
                after = llama_cpp.llama_pos(0)
                status = self._mtmd.mtmd_helper_eval_chunk_single(
                    self._ctx, llama._ctx.ctx, chunk, llama_cpp.llama_pos(position), llama_cpp.llama_seq_id(0),
                    n_batch, False, ctypes.byref(after))
                if status != 0:
                    raise ImageFailed(f"llama.cpp could not evaluate an image (mtmd status {status})")
                position = after.value
            return position

        with self._lock:
            return self._with_chunks(image, run)

    def _layout_of(self, chunks: Any) -> ImageLayout:
        mtmd = self._mtmd
        parts: list[tuple[int, ...] | int] = []
        for index in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, index)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                count = ctypes.c_size_t()
                pointer = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                parts.append(tuple(pointer[i] for i in range(count.value)))
                continue
            n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            if mtmd.mtmd_input_chunk_get_n_pos(chunk) != n_tokens:
                raise ImagesNotSeen("this projector places an image at fewer positions than it has embeddings, "
                                    "which the in-process llama.cpp engine does not drive; serve it on llama_server")
            parts.append(int(n_tokens))
        if not any(isinstance(part, int) for part in parts):
            raise ImageFailed("mtmd made no image embeddings of an image")
        return ImageLayout(tuple(parts))

    def _with_chunks(self, image: ImageInput, use: Callable[[Any], T]) -> T:
        """`use(chunks)`: mtmd's chunks for `image` alone, freed afterwards."""
        mtmd = self._mtmd
        if self._ctx is None:
            raise ImagesNotSeen("the projector is closed")
        bitmap = self._bitmap(image)
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            part = mtmd.mtmd_input_part()
            part.bitmap = bitmap
            parts = (ctypes.POINTER(mtmd.mtmd_input_part) * 1)(ctypes.pointer(part))
            status = mtmd.mtmd_tokenize_from_parts(self._ctx, chunks, parts, 1, False)
            if status != 0:
                raise ImageFailed(f"llama.cpp could not prepare an image (mtmd status {status})")
            return use(chunks)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)

    def _bitmap(self, image: ImageInput) -> Any:
        """An mtmd bitmap of `image` (the caller frees it)."""
        mtmd = self._mtmd
        data = image.data
        if image.media_type in STB_DECODED_TYPES:
            buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, buffer, len(data), False)
        else:
            width, height, pixels = rgb_pixels(data, image.media_type)
            bitmap = mtmd.mtmd_bitmap_init(width, height, (ctypes.c_uint8 * len(pixels)).from_buffer_copy(pixels))
        if not bitmap:
            raise ImageFailed(f"llama.cpp could not decode a {image.media_type} image")
        return bitmap


def rgb_pixels(data: bytes, media_type: str) -> tuple[int, int, bytes]:
    """Width, height and packed RGB bytes of an image file mtmd cannot decode itself (its
    first frame); `ImageFailed` when Pillow cannot read it either."""
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as opened:
            rgb = opened.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageFailed(f"the {media_type} image could not be decoded: {exc}") from exc
    return rgb.width, rgb.height, rgb.tobytes()


__all__ = [
    "LAYOUT_CACHE_ENTRIES",
    "PLACEHOLDER_BITS",
    "PLACEHOLDER_PERIOD",
    "STB_DECODED_TYPES",
    "Eyes",
    "ImageFailed",
    "ImageLayout",
    "ImageSpan",
    "ImagesNotSeen",
    "count_markers",
    "image_spans",
    "image_tokens",
    "place_images",
    "reusable_prefix",
    "rgb_pixels",
]
