"""The pure image rules (`skulk.api.media`): sniffing, data: URLs, bounds, markers, and who
may be sent images. Table-driven, no app."""

from __future__ import annotations

import hashlib

import pytest

from skulk.api import media
from skulk.api.errors import ImageRefused, InvalidRequest, ModelCannotSee
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.engines import Feature, honoured_features, sees_images
from skulk.shared.types.media import IMAGE_MARKER
from tests.api.vision_kit import CARDS, MLX_SEEING, SEEING, b64, data_url, image_bytes, png_header


@pytest.mark.parametrize(("data", "expected"), [
    (image_bytes("PNG"), "image/png"),
    (image_bytes("JPEG"), "image/jpeg"),
    (image_bytes("WEBP"), "image/webp"),
    (image_bytes("GIF"), "image/gif"),
    (b"GIF87a" + b"\0" * 8, "image/gif"),
    (b"RIFF\0\0\0\0WAVE", None),
    (b"<svg xmlns='http://www.w3.org/2000/svg'/>", None),
    (b"%PDF-1.7", None),
    (b"", None),
])
def test_sniff_judges_by_the_bytes(data: bytes, expected: str | None) -> None:
    assert media.sniff(data) == expected


def test_a_checked_image_carries_its_bytes_type_size_and_digest() -> None:
    data = image_bytes("JPEG", (5, 4))
    image = media.image_input(data, "x")
    assert (image.data, image.media_type, image.width, image.height) == (data, "image/jpeg", 5, 4)
    assert image.sha256 == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(("url", "code"), [
    ("data:image/png;base64,", "unsupported_image_type"),
    ("data:image/png;base64,%%%%", "invalid_image"),
    ("data:image/png,rawbytes", "invalid_image"),
    ("data:image/png;base64", "invalid_image"),
    ("data:;base64," + b64(b"not an image at all"), "unsupported_image_type"),
])
def test_bad_data_urls_are_400s_naming_the_field(url: str, code: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        media.image_from_url(url, {}, "messages[0].content[1].image_url.url")
    assert (raised.value.param, raised.value.code) == ("messages[0].content[1].image_url.url", code)


def test_the_declared_type_is_not_trusted() -> None:
    image = media.image_from_url(data_url(image_bytes("GIF"), "image/png"), {}, "x")
    assert image.media_type == "image/gif"


def test_unpadded_and_wrapped_base64_is_taken() -> None:
    text = b64(image_bytes()).rstrip("=")
    assert media.image_input(media.decode_base64(text[:10] + "\n" + text[10:], "x"), "x").width == 3


@pytest.mark.parametrize(("data", "code"), [
    (png_header(50_000, 50_000), "image_too_large"),  # 2.5 G pixels: refused from the header
    (png_header(8_000, 8_000), "image_too_large"),  # 64 MP: under Pillow's own bound, over ours
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "invalid_image"),  # a PNG signature and nothing decodable
    (b"\xff\xd8\xff" + b"\0" * 10, "invalid_image"),
    (b"MZ\x90\0 an executable", "unsupported_image_type"),
])
def test_bad_images_are_refused_by_kind(data: bytes, code: str) -> None:
    with pytest.raises(ImageRefused) as raised:
        media.image_input(data, "images[0]")
    assert (raised.value.param, raised.value.code) == ("images[0]", code)


def test_an_image_over_the_per_image_bound_is_refused_before_decoding() -> None:
    with pytest.raises(InvalidRequest) as raised:
        media.image_input(image_bytes() + b"\0" * media.MAX_IMAGE_BYTES, "x")
    assert raised.value.code == "image_too_large"
    with pytest.raises(InvalidRequest) as raised:
        media.decode_base64("A" * (media.MAX_IMAGE_BYTES * 4 // 3 + 16), "x")
    assert raised.value.code == "image_too_large"


@pytest.mark.parametrize(("detail", "ok"), [(None, True), ("auto", True), ("low", False), ("high", False),
                                            ("ultra", False)])
def test_detail_is_honoured_or_refused_by_name(detail: str | None, ok: bool) -> None:
    if ok:
        assert media.check_detail(detail, "d") == "auto"
    else:
        with pytest.raises(InvalidRequest) as raised:
            media.check_detail(detail, "messages[0].content[0].image_url.detail")
        assert raised.value.param == "messages[0].content[0].image_url.detail"


def _with_images(count: int, size: tuple[int, int] = (3, 2)) -> ChatMessage:
    image = media.image_input(image_bytes(size=size), "x")
    return ChatMessage(role="user", content="\n".join([IMAGE_MARKER] * count + ["what?"]), images=[image] * count)


@pytest.mark.parametrize(("messages", "prompt", "code"), [
    ([_with_images(2)], None, None),
    ([_with_images(media.MAX_IMAGES_PER_REQUEST + 1)], None, "too_many_images"),
    ([ChatMessage(role="user", content=f"a {IMAGE_MARKER}")], None, "image_marker_in_text"),
    ([_with_images(1).model_copy(update={"content": "no marker"})], None, "image_marker_in_text"),
    ([], f"raw {IMAGE_MARKER}", "image_marker_in_text"),
])
def test_request_bounds(messages: list[ChatMessage], prompt: str | None, code: str | None) -> None:
    error = media.check_request(messages, prompt)
    assert (error.code if error else None) == code


def test_the_request_total_is_bounded() -> None:
    big = image_bytes(size=(2, 2)) + b"\0" * (media.MAX_IMAGE_BYTES - 100)
    image = media.image_input(big, "x")
    message = ChatMessage(role="user", content=IMAGE_MARKER * 2, images=[image, image])
    error = media.check_request([message])
    assert error is not None and error.code == "images_too_large"


def test_only_the_llama_cpp_engines_serve_images() -> None:
    assert {e for e in ("llama_server", "llama_cpp", "mlx", "vllm") if Feature.IMAGES in honoured_features(e)} == {
        "llama_server", "llama_cpp"}
    assert Feature.IMAGES not in honoured_features("llama_cpp", pipelined=True)  # a pool does not see
    assert sees_images("llama_cpp") and sees_images("llama_server")
    assert not sees_images("mlx") and not sees_images("vllm")


def test_a_card_sees_when_it_says_so_and_an_engine_of_it_serves_images() -> None:
    assert media.card_sees(CARDS[SEEING])
    assert not media.card_sees(CARDS[MLX_SEEING])  # says vision, but only MLX runs it, not for its family
    assert media.vision_refusal(MLX_SEEING, CARDS[MLX_SEEING], "messages") is None
    refusal = media.vision_refusal("some/model", None, "messages")
    assert isinstance(refusal, ModelCannotSee) and refusal.model_id == "some/model" and "some/model" in refusal.message


def test_one_input_transfer_admits_a_full_request_and_the_topic_one_chunk() -> None:
    import base64

    from skulk.routing.topics import TOPICS
    from skulk.shared.body_limits import MAX_MAX_BODY_BYTES
    from skulk.shared.input_transfer import CHUNK_BYTES, MAX_COMMAND_INPUT_BYTES

    # Every image as base64 inside the TaskInput, plus the largest body's text, plus framing.
    full = media.MAX_REQUEST_IMAGE_BYTES * 4 // 3 + MAX_MAX_BODY_BYTES + (1 << 20)
    assert full <= MAX_COMMAND_INPUT_BYTES
    # One chunk as base64 with its header, framed: what the topic must admit.
    assert (TOPICS.task_inputs.max_payload_bytes or 0) >= len(base64.b64encode(bytes(CHUNK_BYTES))) + 4096


def test_stored_responses_bound_the_image_bytes_they_keep() -> None:
    from skulk.api.response_store import ResponseStore, StoredResponse

    message = _with_images(1)
    size = len(message.images[0].data_b64)
    store = ResponseStore(image_bytes=2 * size)
    for name in ("a", "b", "c"):
        store.put(name, StoredResponse("", 0.0, {}, (message,)))
    assert [store.get(name, "", 0.0) is not None for name in ("a", "b", "c")] == [False, True, True]
