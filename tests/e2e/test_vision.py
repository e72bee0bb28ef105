"""Images end to end on real nodes: the built-in tiny VLM (`local/tiny-vlm-gguf`: a tiny llama
and a random-weights projector the node generates) placed on node B, served by the bundled
llama-server with its projector, asked about images through node A with the official
OpenAI, Anthropic and Ollama SDKs; and on one node serving in process (the llama_cpp engine,
its projector driven with mtmd). The image demonstrably reaches the model (the prompt grows
by the projector's 16 tokens; two images give two greedy answers), a refused image is a typed
400 while the model goes on serving, and no image bytes (raw or base64) are left in either
node's data dir or State."""

from __future__ import annotations

import base64
import io
import os
import random
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from PIL import Image

from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.e2e.test_openai_serving import place, wait_instance_ready
from tests.llama_server_kit import require_bundled_server
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(420)

MODEL = "local/tiny-vlm-gguf"
IMAGE_TOKENS = 16
"""What the generated projector makes of any image: (32 / 8) ** 2 patches."""


def grew_by_an_image(without: int, with_image: int) -> bool:
    """The prompt grew by the image's tokens, plus at most the separator the adapter writes
    between a message's parts (a newline: one or two tokens, as the tokenizer joins it)."""
    return IMAGE_TOKENS <= with_image - without <= IMAGE_TOKENS + 2


def png(pixels: bytes, size: tuple[int, int] = (32, 32)) -> bytes:
    out = io.BytesIO()
    Image.frombytes("RGB", size, pixels).save(out, format="PNG")
    return out.getvalue()


BLACK = png(bytes(32 * 32 * 3))
WHITE = png(b"\xff" * (32 * 32 * 3))
NOISE = png(random.Random(29).randbytes(32 * 32 * 3))
"""A noise image: its bytes and their base64 occur nowhere by chance, so a search of the data
dirs for them means something."""


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def ask(client: openai.OpenAI, image: bytes | None, text: str = "What is this?") -> openai.types.chat.ChatCompletion:
    parts: list[dict] = [{"type": "text", "text": text}]
    if image is not None:
        parts.append({"type": "image_url", "image_url": {"url": data_url(image)}})
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=8,
                                          temperature=0)


def test_images_through_node_a_reach_the_model_on_node_b(spawn_node, tmp_path):
    require_bundled_server()
    env = {"SKULK_LLAMA_SERVER_BIN": "", "SKULK_BUNDLED_LLAMA_SERVER": "1",
           "SKULK_ENGINES_DIR": str(tmp_path / "no-engines-built")}
    a, b = start_linked(spawn_node, ["see-a", "see-b"], envs={"see-a": env, "see-b": env})
    wait_agreed([a, b], members=2)

    def placed() -> httpx.Response | None:
        response = httpx.post(a.url + "/place_instance", json={"modelId": MODEL, "excludedNodes": [node_id(a)]},
                              timeout=10)
        return None if response.status_code == 503 else response

    response = wait_for(placed, timeout_s=90, interval_s=0.5, what="the VLM placed")
    assert response.status_code == 200, response.text
    body = wait_instance_ready(a, response.json()["instanceId"], timeout_s=240)
    assert {s["nodeId"] for s in body["shards"]} == {node_id(b)}
    assert all(s["backend"].startswith("llama_server") for s in body["shards"])

    # OpenAI: the image's tokens are in the prompt, and what the model says depends on it.
    sdk = openai.OpenAI(base_url=a.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    plain, black, white = ask(sdk, None), ask(sdk, BLACK), ask(sdk, WHITE)
    assert grew_by_an_image(plain.usage.prompt_tokens, black.usage.prompt_tokens), (plain.usage, black.usage)
    assert white.usage.prompt_tokens == black.usage.prompt_tokens
    assert black.choices[0].message.content != white.choices[0].message.content
    assert ask(sdk, BLACK).choices[0].message.content == black.choices[0].message.content  # greedy: the same again

    # Anthropic: a base64 image block.
    claude = anthropic.Anthropic(base_url=a.url, api_key="unused", max_retries=0, timeout=120)

    def claude_asks(image: bytes | None) -> anthropic.types.Message:
        content: list[dict] = [{"type": "text", "text": "What is this?"}]
        if image is not None:
            content.append({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                        "data": base64.b64encode(image).decode()}})
        return claude.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": content}])

    def prompt_of(message: anthropic.types.Message) -> int:  # Anthropic counts cache reads apart
        return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)

    assert grew_by_an_image(prompt_of(claude_asks(None)), prompt_of(claude_asks(NOISE)))

    # Ollama: `images` on the message.
    ollama = pytest.importorskip("ollama")
    llama = ollama.Client(host=a.url + "/ollama", timeout=120)
    with_image = llama.chat(model=MODEL, messages=[{"role": "user", "content": "What is this?", "images": [NOISE]}],
                            options={"temperature": 0, "num_predict": 8})
    without = llama.chat(model=MODEL, messages=[{"role": "user", "content": "What is this?"}],
                         options={"temperature": 0, "num_predict": 8})
    assert grew_by_an_image(without.prompt_eval_count, with_image.prompt_eval_count)

    # A refused image is a typed 400 in the caller's shape; the model goes on serving.
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/cat.png"}}]}])
    assert refused.value.code == "image_url_refused"
    with pytest.raises(anthropic.BadRequestError) as too_big:
        claude.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png_header_claiming(50_000, 50_000)).decode()}}]}])
    assert too_big.value.status_code == 400
    assert ask(sdk, NOISE).usage.prompt_tokens == black.usage.prompt_tokens

    # No image bytes anywhere a node keeps things, nor in State.
    raw, encoded = NOISE, base64.b64encode(NOISE)
    for node in (a, b):
        assert raw not in node.get("/state").content and encoded not in node.get("/state").content
        for path in files_under(node.data_dir):
            content = path.read_bytes()
            assert raw not in content and encoded not in content, f"image bytes in {path}"


def test_images_reach_the_model_served_in_process(spawn_node):
    """A node with no llama-server (the suite's default: in process) places the VLM on the
    llama_cpp engine, which sees through the card's projector."""
    (node,) = start_linked(spawn_node, ["see-in-process"])
    wait_agreed([node], members=1)
    body = wait_instance_ready(node, place(node, modelId=MODEL)["instanceId"], timeout_s=240)
    assert all(s["backend"].startswith("llama_cpp") for s in body["shards"]), body["shards"]

    sdk = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    plain, black, white = ask(sdk, None), ask(sdk, BLACK), ask(sdk, WHITE)
    assert grew_by_an_image(plain.usage.prompt_tokens, black.usage.prompt_tokens), (plain.usage, black.usage)
    assert white.usage.prompt_tokens == black.usage.prompt_tokens
    assert black.choices[0].message.content != white.choices[0].message.content
    again = ask(sdk, BLACK)
    assert again.choices[0].message.content == black.choices[0].message.content  # greedy: the same again

    claude = anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0, timeout=120)
    content: list[dict] = [{"type": "text", "text": "What is this?"}]
    counted = claude.messages.count_tokens(model=MODEL, messages=user_says(content))
    content.append({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                "data": base64.b64encode(NOISE).decode()}})
    with_image = claude.messages.count_tokens(model=MODEL, messages=user_says(content))
    assert grew_by_an_image(counted.input_tokens, with_image.input_tokens)  # counting sees the image too
    ollama = pytest.importorskip("ollama")
    llama = ollama.Client(host=node.url + "/ollama", timeout=120)
    seen = llama.chat(model=MODEL, messages=[{"role": "user", "content": "What is this?", "images": [NOISE]}],
                      options={"temperature": 0, "num_predict": 8})
    unseen = llama.chat(model=MODEL, messages=[{"role": "user", "content": "What is this?"}],
                        options={"temperature": 0, "num_predict": 8})
    assert grew_by_an_image(unseen.prompt_eval_count, seen.prompt_eval_count)


def test_a_pooled_instance_refuses_images_by_name_and_serves_text(spawn_node):
    """The VLM pooled over two in-process nodes (llama.cpp's RPC pool): a pool's driver has no
    mtmd path over its donors' layers, so an image is a typed 400 naming the engine, and text
    goes on being served."""
    nodes = start_linked(spawn_node, ["see-pool-a", "see-pool-b"])
    wait_agreed(nodes, members=2)
    wait_for(lambda: len(nodes[0].get("/state").json()["nodeNetwork"]) == 2, timeout_s=60, interval_s=0.25,
             what="every node's network in State")
    body = wait_instance_ready(nodes[0], place(nodes[0], modelId=MODEL, minNodes=2)["instanceId"], timeout_s=240)
    assert len({s["nodeId"] for s in body["shards"]}) == 2
    assert all(s["backend"].startswith("llama_cpp") for s in body["shards"]), body["shards"]

    sdk = openai.OpenAI(base_url=nodes[0].url + "/v1", api_key="unused", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as refused:
        ask(sdk, BLACK)
    assert refused.value.code == "unsupported_feature"
    assert "image input" in str(refused.value) and "llama_cpp" in str(refused.value)
    assert ask(sdk, None).usage.prompt_tokens > 0


def user_says(content: list[dict]) -> Any:
    """One user turn for the Anthropic SDK (its message types are TypedDicts)."""
    return [{"role": "user", "content": content}]


def png_header_claiming(width: int, height: int) -> bytes:
    """A PNG whose header declares `width` x `height` pixels (and holds none)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))


def files_under(root: Path) -> list[Path]:
    """Every file a node wrote, less the model files (weights never hold a request's bytes)."""
    found = []
    for directory, _dirs, files in os.walk(root):
        if "/models" in directory or "/staging" in directory:
            continue
        found.extend(Path(directory) / name for name in files)
    return found
