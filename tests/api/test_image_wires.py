"""Images on every chat wire format, in process on the scripted cluster: what the runner
receives (the `ImageInput`s with bytes, digest and size, and `IMAGE_MARKER` where each image
stood), the official SDKs' image forms, the refusals (each a typed 400 in the caller's
shape), and that no image byte reaches State or the event log."""

from __future__ import annotations

import base64
import hashlib
import itertools
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from skulk.api import media
from skulk.master.commands import DecisionContext, decide
from skulk.shared.apply import apply
from skulk.shared.codec import pack
from skulk.shared.types.commands import GenerateText
from skulk.shared.types.events import IndexedEvent
from skulk.shared.types.media import IMAGE_MARKER
from tests.api.scripted_cluster import asgi_http
from tests.api.test_anthropic_routes import sdk as anthropic_sdk
from tests.api.vision_kit import (
    BLIND,
    MLX_SEEING,
    SEEING,
    STATE,
    b64,
    data_url,
    image_bytes,
    loopback_server,
    png_header,
    vision_app,
)

PNG = image_bytes("PNG", (3, 2))
JPEG = image_bytes("JPEG", (4, 5), (10, 200, 10))
M = IMAGE_MARKER


def _openai(model: str, *parts: Any) -> tuple[str, dict]:
    return "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": list(parts)}]}


def _image_url(url: str, detail: str | None = None) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **({"detail": detail} if detail else {})}}


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


REQUESTS: dict[str, tuple[str, dict, str, list[bytes]]] = {
    "openai.chat": (*_openai(SEEING, _text("Compare"), _image_url(data_url(PNG)), _text("with"),
                             _image_url(data_url(JPEG, "image/jpeg"), "auto")),
                    f"Compare\n{M}\nwith\n{M}", [PNG, JPEG]),
    "openai.responses": ("/v1/responses", {"model": SEEING, "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(PNG)}, {"type": "input_text", "text": "What is this?"}]}]},
        f"{M}\nWhat is this?", [PNG]),
    "anthropic.messages": ("/v1/messages", {"model": SEEING, "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
        {"type": "text", "text": "and"},
        {"type": "image", "source": {"type": "url", "url": data_url(JPEG, "image/jpeg")}}]}]},
        f"{M}\nand\n{M}", [PNG, JPEG]),
    "ollama.chat": ("/ollama/api/chat", {"model": SEEING, "stream": False, "messages": [
        {"role": "user", "content": "What are these?", "images": [b64(PNG), b64(JPEG)]}]},
        f"{M}\n{M}\nWhat are these?", [PNG, JPEG]),
    "ollama.generate": ("/ollama/api/generate", {"model": SEEING, "stream": False, "prompt": "Describe.",
                                                 "images": [b64(JPEG)]}, f"{M}\nDescribe.", [JPEG]),
}


async def _post(http: httpx.AsyncClient, path: str, body: dict) -> httpx.Response:
    return await http.post(path, json=body)


def _assert_images(params, text: str, images: list[bytes]) -> None:
    user = params.messages[-1]
    assert user.content == text
    assert [(i.data, i.sha256, i.media_type) for i in user.images] == [
        (data, hashlib.sha256(data).hexdigest(), media.sniff(data)) for data in images]
    sizes = {PNG: (3, 2), JPEG: (4, 5)}
    assert [(i.width, i.height) for i in user.images] == [sizes[data] for data in images]


@pytest.mark.parametrize("wire", sorted(REQUESTS))
async def test_every_wire_carries_its_images_to_the_runner(wire: str) -> None:
    path, body, text, images = REQUESTS[wire]
    app, cluster = vision_app()
    async with asgi_http(app) as http:
        response = await http.post(path, json=body)
    assert response.status_code == 200, response.text
    _assert_images(cluster.params(), text, images)


async def test_an_image_url_is_fetched_by_the_api_node_with_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKULK_IMAGE_FETCH_ALLOW_PRIVATE", "1")
    app, cluster = vision_app()
    with loopback_server() as url:
        async with asgi_http(app) as http:
            response = await _post(http, *_openai(SEEING, _image_url(url), _text("What is it?")))
    assert response.status_code == 200, response.text
    _assert_images(cluster.params(), f"{M}\nWhat is it?", [image_bytes()])


async def test_the_official_sdks_send_images_that_arrive() -> None:
    openai = pytest.importorskip("openai")
    ollama = pytest.importorskip("ollama")
    app, cluster = vision_app()
    async with asgi_http(app) as http:
        client = openai.AsyncOpenAI(base_url="http://skulk/v1", api_key="unused", http_client=http, max_retries=0)
        answer = await client.chat.completions.create(model=SEEING, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": data_url(PNG)}}]}])
        assert answer.choices[0].message.content == "I see"
        await client.responses.create(model=SEEING, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": data_url(JPEG, "image/jpeg"), "detail": "auto"}]}])
    _, anthropic = anthropic_sdk(app)
    await anthropic.messages.create(model=SEEING, max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}]}])
    sdk = ollama.AsyncClient(host="http://skulk/ollama", transport=httpx.ASGITransport(app=app))
    await sdk.chat(model=SEEING, messages=[{"role": "user", "content": "hi", "images": [JPEG]}])
    sent = cluster.all_params()
    _assert_images(sent[0], f"What is this?\n{M}", [PNG])
    _assert_images(sent[1], M, [JPEG])
    _assert_images(sent[2], M, [PNG])
    _assert_images(sent[3], f"{M}\nhi", [JPEG])


# ---------------------------------------------------------------------------------------
# Refusals, in each caller's shape
# ---------------------------------------------------------------------------------------

CASES: dict[str, tuple[str, str | bytes, str]] = {
    # case: (model, the image (a URL, or bytes sent inline), code)
    "oversized": (SEEING, PNG + b"\0" * 2048, "image_too_large"),
    "bad-data-url": (SEEING, "data:image/png;base64,@@@", "invalid_image"),
    "loopback-url": (SEEING, "http://127.0.0.1:1/cat.png", "image_url_refused"),
    "bomb-header": (SEEING, png_header(50_000, 50_000), "image_too_large"),
    "not-an-image": (SEEING, b"%PDF-1.7 this is a document", "unsupported_image_type"),
    "blind-model": (BLIND, PNG, "model_cannot_see"),
    "engine-cannot-see": (MLX_SEEING, PNG, "unsupported_feature"),
}


def _body(shape: str, model: str, image: str | bytes) -> tuple[str, dict]:
    url = image if isinstance(image, str) else data_url(image)
    if shape == "openai":
        return _openai(model, _text("look"), _image_url(url))
    if shape == "anthropic":
        source = {"type": "url", "url": url} if isinstance(image, str) else \
            {"type": "base64", "media_type": "image/png", "data": b64(image)}
        return "/v1/messages", {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": source}, _text("look")]}]}
    inline = image if isinstance(image, str) else b64(image)
    return "/ollama/api/chat", {"model": model, "stream": False,
                                "messages": [{"role": "user", "content": "look", "images": [inline]}]}


def _error(shape: str, response: httpx.Response) -> str:
    body = response.json()
    if shape == "openai":
        assert body["error"]["type"] == "invalid_request_error"
        return f"{body['error']['code']} {body['error']['param']} {body['error']['message']}"
    if shape == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return body["error"]["message"]
    assert set(body) == {"error"}
    return body["error"]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("shape", ["openai", "anthropic", "ollama"])
async def test_refusals_are_typed_400s_in_the_callers_shape(shape: str, case: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    model, image, code = CASES[case]
    monkeypatch.setattr(media, "MAX_IMAGE_BYTES", 2048)  # an oversized image within the body bound
    app, cluster = vision_app()
    async with asgi_http(app) as http:
        response = await _post(http, *_body(shape, model, image))
    assert response.status_code == 400, response.text
    message = _error(shape, response)
    if shape == "openai":
        assert message.startswith(code), message
    if case in ("blind-model", "engine-cannot-see"):
        assert model in message
    assert not [c for c in cluster.commands if isinstance(c, GenerateText)]


@pytest.mark.parametrize(("path", "body", "param"), [
    (*_openai(SEEING, _text(f"say {M}")), "messages[0].content[0].text"),
    ("/v1/responses", {"model": SEEING, "input": f"x {M}"}, "input"),
    ("/v1/responses", {"model": SEEING, "instructions": M, "input": "x"}, "instructions"),
    (*_openai(SEEING, _image_url(data_url(PNG), "low")), "messages[0].content[0].image_url.detail"),
])
async def test_a_literal_marker_or_an_unserved_detail_is_refused_by_field(path: str, body: dict, param: str) -> None:
    app, _ = vision_app()
    async with asgi_http(app) as http:
        response = await http.post(path, json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


async def test_many_images_count_against_the_context_before_anything_queues(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(media, "IMAGE_TOKENS_ESTIMATE", 4096)  # 2 images x 4096 >= the 8192 context
    app, cluster = vision_app()
    async with asgi_http(app) as http:
        response = await _post(http, *_openai(SEEING, _image_url(data_url(PNG)), _image_url(data_url(PNG))))
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert cluster.commands == []


async def test_ollama_show_lists_vision_only_where_the_model_can_be_sent_images() -> None:
    app, _ = vision_app()
    async with asgi_http(app) as http:
        shown = {model: (await http.post("/ollama/api/show", json={"model": model})).json()["capabilities"]
                 for model in (SEEING, BLIND, MLX_SEEING)}
    assert ["vision" in shown[m] for m in (SEEING, BLIND, MLX_SEEING)] == [True, False, False]


# ---------------------------------------------------------------------------------------
# Never in State or the event log
# ---------------------------------------------------------------------------------------


async def test_no_image_bytes_reach_state_or_the_event_log() -> None:
    distinctive = image_bytes("PNG", (7, 7), (1, 2, 3))
    app, cluster = vision_app()
    async with asgi_http(app) as http:
        response = await _post(http, *_openai(SEEING, _image_url(data_url(distinctive)), _text("what?")))
    assert response.status_code == 200, response.text
    [command] = [c for c in cluster.commands if isinstance(c, GenerateText)]
    # The serving node's full params carry the image (the data plane's TaskInput) ...
    assert cluster.params().messages[-1].images[0].data == distinctive
    # ... what the master decides from, orders, logs and applies does not.
    counter = itertools.count()
    events = decide(STATE, command, DecisionContext(new_id=lambda: f"e{next(counter)}", origin="n1"))
    assert events
    state = STATE
    logged = []
    for idx, event in enumerate(events):
        indexed = IndexedEvent(idx=idx, origin="n1", indexed_at=datetime.now(UTC), event=event)
        logged.append(pack(indexed))
        state = apply(state, indexed)
    encoded = base64.b64encode(distinctive)
    for blob in [pack(command), *logged, pack(state), state.model_dump_json().encode()]:
        assert distinctive not in blob and encoded not in blob and encoded[:64] not in blob
    assert not any(m.images for task in state.tasks.values() for m in getattr(task.params, "messages", []))


async def test_a_blind_model_is_refused_before_any_url_is_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKULK_IMAGE_FETCH_ALLOW_PRIVATE", "1")
    hits: list[str] = []
    app, _ = vision_app()
    with loopback_server() as url:
        async def fetch(urls):
            hits.extend(u for u, _ in urls)
            return {}
        monkeypatch.setattr("skulk.api.generation.fetch_request_images", fetch)
        async with asgi_http(app) as http:
            response = await _post(http, *_openai(BLIND, _image_url(url)))
    assert response.status_code == 400 and response.json()["error"]["code"] == "model_cannot_see"
    assert hits == []


async def test_ollama_generate_with_images_and_no_prompt_is_a_generation() -> None:
    app, cluster = vision_app()
    async with asgi_http(app) as http:
        response = await _post(http, "/ollama/api/generate", {"model": SEEING, "stream": False, "images": [b64(PNG)]})
    assert response.status_code == 200 and response.json()["response"] == "I see", response.text
    _assert_images(cluster.params(), M, [PNG])


def test_the_responses_websocket_carries_images_and_continues_with_them() -> None:
    from starlette.testclient import TestClient

    from tests.api.test_responses_spec import turn

    app, cluster = vision_app()
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": data_url(PNG)},
                                          {"type": "input_text", "text": "What is this?"}]}]
    with TestClient(app) as client, client.websocket_connect("/v1/responses") as ws:
        first = turn(ws, model=SEEING, input=image, store=False)
        assert first[-1]["type"] == "response.completed", first[-1]
        second = turn(ws, model=SEEING, input="And now?", previous_response_id=first[-1]["response"]["id"], store=False)
        assert second[-1]["type"] == "response.completed", second[-1]
        blind = turn(ws, model=BLIND, input=image)
        assert blind[-1]["type"] == "error" and blind[-1]["code"] == "model_cannot_see"
    first_params, second_params = cluster.all_params()
    _assert_images(first_params, f"{M}\nWhat is this?", [PNG])
    assert [len(m.images) for m in second_params.messages] == [1, 0, 0]  # the continued turn keeps its image


async def test_counting_tokens_with_images_needs_an_engine_that_sees() -> None:
    app, cluster = vision_app()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    async with asgi_http(app) as http:
        refused = await _post(http, "/v1/messages/count_tokens",
                              {"model": MLX_SEEING, "messages": [{"role": "user", "content": [image]}]})
        counted = await _post(http, "/v1/messages/count_tokens",
                              {"model": SEEING, "messages": [{"role": "user", "content": [image]}]})
    assert refused.status_code == 400 and "mlx" in refused.json()["error"]["message"], refused.text
    assert counted.status_code == 200, counted.text
    _assert_images(cluster.params(), M, [PNG])
