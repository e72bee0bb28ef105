"""The in-process llama.cpp engine seeing images: the generated tiny VLM (local/tiny-vlm-gguf,
the tiny llama plus a random-weights LLaVA-style projector) loaded with its projector through
mtmd, sent chat messages carrying `ImageInput`s. Random weights say nothing about what an
image shows; what a user would notice is still testable: an image costs its tokens in the
prompt (as many as llama-server counts), different images steer the output apart, the same
image gives the same output, the prefix cache never reuses KV past a different image, and a
vision card without its projector, or a model that does not see, is refused by name.

The pure half of `llama_cpp.vision` (stand-in tokens, placing images, spans) is tested
table-driven at the bottom, without a model."""

from __future__ import annotations

import struct
import threading
import zlib
from pathlib import Path

import pytest

from skulk.models.cards import builtin_cards_dir, load_card
from skulk.models.companions import projector_path
from skulk.models.tiny_models import TINY_VISION_SPEC
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.common import ChatMessage, Usage
from skulk.shared.types.engines import Feature, honoured_features
from skulk.shared.types.ids import ModelId
from skulk.shared.types.media import IMAGE_MARKER, ImageInput
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import GeneratedToken, ShardSpec
from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine
from skulk.worker.engines.llama_cpp.vision import (
    ImageFailed,
    ImageLayout,
    ImagesNotSeen,
    ImageSpan,
    image_spans,
    image_tokens,
    place_images,
    reusable_prefix,
)
from skulk.worker.engines.projector import ProjectorMissing
from tests.worker.tiny_gguf import RUNNER, tiny_gguf, tiny_gguf_card, tiny_instance  # noqa: F401

pytestmark = pytest.mark.timeout(300)

VLM_MODEL_ID = "local/tiny-vlm-gguf"
CONTEXT = 512
ANSWER_TOKENS = 8
BLACK, WHITE, RED = (0, 0, 0), (255, 255, 255), (255, 0, 0)


def vlm_card() -> ModelCard:
    return load_card(builtin_cards_dir() / "local--tiny-vlm-gguf.toml")


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour RGB PNG (zlib and struct only)."""
    row = b"\x00" + bytes(rgb) * width

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(row * height))
            + chunk(b"IEND", b""))


def image(rgb: tuple[int, int, int]) -> ImageInput:
    return ImageInput.of(png(48, 40, rgb), "image/png", 48, 40)


def ask(content: str, *images: ImageInput, model: str = VLM_MODEL_ID) -> TextGenerationParams:
    return TextGenerationParams(
        model_id=ModelId(model), messages=[ChatMessage(role="user", content=content, images=list(images))],
        max_tokens=ANSWER_TOKENS, temperature=0.0,
    )


def answer(engine, params: TextGenerationParams) -> tuple[str, int | None, Usage]:
    """The text, the prompt length announced on the first token, and the final usage."""
    tokens: list[GeneratedToken] = list(engine.generate(params, threading.Event()))
    usage = tokens[-1].usage
    assert usage is not None
    return "".join(t.text for t in tokens), tokens[0].prompt_tokens, usage


def spec_for(model: Path, projector: str | None, card: ModelCard | None = None) -> ShardSpec:
    card = card or vlm_card()
    return ShardSpec(instance=tiny_instance(card, context_token_limit=CONTEXT), runner_id=RUNNER, card=card,
                     model_path=str(model), n_threads=2, projector_path=projector)


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory) -> tuple[Path, str]:
    """The generated model.gguf and its mmproj.gguf, as the worker resolves them."""
    from skulk.artifacts.resolve import ensure_local_model

    model = ensure_local_model(vlm_card(), tmp_path_factory.mktemp("models"))
    projector = projector_path(vlm_card(), {}, str(model))
    assert projector is not None and Path(projector).is_file(), projector
    return model, projector


@pytest.fixture(scope="module")
def engine(tiny_vlm):
    model, projector = tiny_vlm
    engine = LlamaCppEngine()
    engine.load(spec_for(model, projector))
    engine.warm_up()
    yield engine
    engine.close()


def test_the_engine_sees_through_the_cards_projector(engine):
    assert engine.sees
    assert Feature.IMAGES in honoured_features("llama_cpp")
    assert Feature.IMAGES not in honoured_features("llama_cpp", pipelined=True)  # a pool refuses images


def test_an_image_costs_its_tokens_in_the_prompt(engine):
    _, announced_text, text_only = answer(engine, ask("what is this"))
    _, announced_image, with_image = answer(engine, ask(f"what is{IMAGE_MARKER} this", image(BLACK)))
    assert with_image.prompt_tokens - text_only.prompt_tokens == TINY_VISION_SPEC.image_tokens
    assert (announced_text, announced_image) == (text_only.prompt_tokens, with_image.prompt_tokens)
    counted = engine.prompt_tokens(ask(f"what is{IMAGE_MARKER} this", image(BLACK)))  # count-only requests
    assert len(counted) == with_image.prompt_tokens


def test_the_prompt_counts_as_many_tokens_as_llama_server_counts(engine, tiny_vlm):
    """The same request through a real llama-server with `--mmproj`: the same prompt length."""
    from skulk.worker.engines.served.llama_server import LlamaServerEngine
    from tests.llama_server_kit import require_llama_server

    model, projector = tiny_vlm
    server = LlamaServerEngine({"SKULK_LLAMA_SERVER_BIN": str(require_llama_server()), "PATH": "/usr/bin:/bin"})
    card = vlm_card()
    server.load(ShardSpec(instance=tiny_instance(card, context_token_limit=CONTEXT, backend="llama_server-cpu"),
                          runner_id=RUNNER, card=card, model_path=str(model), n_threads=2, projector_path=projector))
    try:
        for params in (ask(f"{IMAGE_MARKER}what is this", image(RED)),
                       ask(f"compare {IMAGE_MARKER} and {IMAGE_MARKER}", image(BLACK), image(WHITE))):
            _, _, served = answer(server, params)
            _, _, in_process = answer(engine, params)
            assert in_process.prompt_tokens == served.prompt_tokens
    finally:
        server.close()


def test_different_images_steer_the_answer_and_the_same_image_does_not(engine):
    black, _, first = answer(engine, ask(f"{IMAGE_MARKER}what is this", image(BLACK)))
    white, _, _ = answer(engine, ask(f"{IMAGE_MARKER}what is this", image(WHITE)))
    red, _, _ = answer(engine, ask(f"{IMAGE_MARKER}what is this", image(RED)))
    again, _, repeated = answer(engine, ask(f"{IMAGE_MARKER}what is this", image(BLACK)))
    assert len({black, white, red}) == 3, (black, white, red)
    assert again == black
    assert repeated.prompt_tokens == first.prompt_tokens


def test_the_prefix_cache_never_reuses_kv_past_a_different_image(engine):
    text = f"a long enough preamble to cache {IMAGE_MARKER} and then text"
    fresh, _, _ = answer(engine, ask("something else entirely"))  # the hot context holds no image
    red, _, _ = answer(engine, ask(text, image(RED)))
    red_again, _, same = answer(engine, ask(text, image(RED)))
    white, _, other = answer(engine, ask(text, image(WHITE)))
    red_cold, _, back = answer(engine, ask(text, image(RED)))  # from the cold store, past the white one
    # The same image: all but the last prompt token come back; another image: only the text
    # before it (shorter than the image's own tokens plus the text after it).
    assert same.cached_tokens >= same.prompt_tokens - 1
    assert other.cached_tokens < other.prompt_tokens - TINY_VISION_SPEC.image_tokens
    assert (red_again, red_cold) == (red, red)
    assert white != red
    assert back.cached_tokens >= back.prompt_tokens - 1
    assert fresh  # the text-only request answered too


def test_two_images_in_one_message_stand_in_order(engine):
    one_way, _, usage = answer(engine, ask(f"{IMAGE_MARKER}{IMAGE_MARKER}what", image(BLACK), image(WHITE)))
    other_way, _, _ = answer(engine, ask(f"{IMAGE_MARKER}{IMAGE_MARKER}what", image(WHITE), image(BLACK)))
    _, _, text_only = answer(engine, ask("what"))
    assert usage.prompt_tokens - text_only.prompt_tokens == 2 * TINY_VISION_SPEC.image_tokens
    assert one_way != other_way


@pytest.mark.parametrize(("pillow_format", "media_type"), [("JPEG", "image/jpeg"), ("GIF", "image/gif"),
                                                           ("WEBP", "image/webp")])
def test_every_type_the_api_accepts_is_seen(engine, pillow_format, media_type):
    """mtmd decodes PNG, JPEG and GIF itself; WebP is decoded to pixels first (Pillow)."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(out, format=pillow_format)
    picture = ImageInput.of(out.getvalue(), media_type, 40, 30)
    _, _, text_only = answer(engine, ask("what"))
    _, _, seen = answer(engine, ask(f"{IMAGE_MARKER}what", picture))
    assert seen.prompt_tokens - text_only.prompt_tokens == TINY_VISION_SPEC.image_tokens


def test_an_image_nothing_can_decode_is_refused_and_the_engine_goes_on(engine):
    broken = ImageInput.of(b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "image/png", 4, 4)
    with pytest.raises(ImageFailed, match="could not decode"):
        answer(engine, ask(f"{IMAGE_MARKER}what", broken))
    assert answer(engine, ask(f"{IMAGE_MARKER}what", image(RED)))[2].prompt_tokens > TINY_VISION_SPEC.image_tokens


def test_an_image_over_the_context_is_refused_before_anything_runs(engine):
    from skulk.worker.engines.base import PromptTooLong

    many = [image(BLACK)] * (CONTEXT // TINY_VISION_SPEC.image_tokens + 1)
    with pytest.raises(PromptTooLong):
        answer(engine, ask(IMAGE_MARKER * len(many), *many))
    assert answer(engine, ask("still serving"))[0] is not None


def test_a_vision_card_without_its_projector_is_refused_at_load(tiny_vlm):
    model, _ = tiny_vlm
    with pytest.raises(ProjectorMissing, match="tiny-vlm-gguf"):
        LlamaCppEngine().load(spec_for(model, None))


def test_a_model_that_does_not_see_refuses_images_by_name(tiny_gguf):
    engine = LlamaCppEngine()
    engine.load(spec_for(tiny_gguf, None, tiny_gguf_card()))
    try:
        assert not engine.sees
        with pytest.raises(ImagesNotSeen, match="does not see images"):
            answer(engine, ask(f"{IMAGE_MARKER}what", image(RED), model="local/tiny-llama-gguf"))
    finally:
        engine.close()


# -- the pure half ---------------------------------------------------------------------------

DIGEST_A = "a" * 64
DIGEST_B = "b" * 64
LAYOUT = ImageLayout((4,))
WRAPPED = ImageLayout(((7,), 3, (8,)))


@pytest.mark.parametrize(("digest", "layout", "length", "text"), [
    (DIGEST_A, LAYOUT, 4, []),
    (DIGEST_A, WRAPPED, 5, [7, 8]),
])
def test_stand_in_tokens_are_negative_and_keep_the_layouts_text(digest, layout, length, text):
    tokens = image_tokens(digest, layout)
    assert len(tokens) == length == layout.n_tokens
    assert [t for t in tokens if t >= 0] == text


def test_different_images_have_different_stand_ins():
    assert image_tokens(DIGEST_A, ImageLayout((16,))) != image_tokens(DIGEST_B, ImageLayout((16,)))
    assert image_tokens(DIGEST_A, ImageLayout((16,))) == image_tokens(DIGEST_A, ImageLayout((16,)))
    # Nine positions in a row carry the whole digest: digests one bit apart, anywhere, differ.
    base = int(DIGEST_A, 16)
    for bit in range(256):
        other = f"{base ^ (1 << bit):064x}"
        assert image_tokens(DIGEST_A, ImageLayout((9,))) != image_tokens(other, ImageLayout((9,))), bit
    assert min(image_tokens("f" * 64, ImageLayout((9,)))) >= -(2 ** 31)  # fits llama-cpp-python's int32 ids


@pytest.mark.parametrize(("pieces", "expansions", "placed"), [
    (["x", 5, f"a{IMAGE_MARKER}b"], [[-1, -2]], ["x", 5, "a", -1, -2, "b"]),
    ([f"{IMAGE_MARKER}{IMAGE_MARKER}"], [[-1], [-2]], [-1, -2]),
    (["plain"], [], ["plain"]),
])
def test_images_are_placed_at_their_markers_in_order(pieces, expansions, placed):
    assert place_images(pieces, expansions) == placed


@pytest.mark.parametrize(("pieces", "expansions"), [
    ([f"{IMAGE_MARKER}"], []),
    (["no marker"], [[-1]]),
    ([f"{IMAGE_MARKER}{IMAGE_MARKER}"], [[-1]]),
])
def test_markers_and_images_that_disagree_are_refused(pieces, expansions):
    with pytest.raises(ImageFailed, match="image markers"):
        place_images(pieces, expansions)


def test_spans_find_each_image_whole_and_in_order():
    a, b = image_tokens(DIGEST_A, WRAPPED), image_tokens(DIGEST_A, WRAPPED)  # the same image twice
    prompt = [1, 2, *a, 3, *b, 4]
    spans = image_spans(prompt, [a, b], [image(BLACK), image(BLACK)])
    assert [(s.start, s.end) for s in spans] == [(2, 7), (8, 13)]


@pytest.mark.parametrize(("cached", "kept"), [(0, 0), (3, 3), (4, 3), (8, 3), (9, 9), (12, 12)])
def test_a_reused_prefix_never_ends_inside_an_image(cached, kept):
    spans = [ImageSpan(3, 9, image(BLACK))]
    assert reusable_prefix(cached, spans) == kept
