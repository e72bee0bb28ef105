"""Images on MLX end to end, per family the vision path serves: the generated LLaVA model
`local/tiny-vlm`, Gemma 3 model `local/tiny-gemma3-vlm` and Qwen2.5-VL model
`local/tiny-qwen2.5-vl` placed on a real node, loaded by its
runner through mlx-vlm (MLX's vision path), asked about images with the official OpenAI SDK.
The image reaches the model (the prompt grows by the positions its processor gives an image;
two images, two greedy answers; the same image, the same answer, streamed or not), and what
the vision path does not honour is a typed 400 naming the feature while the model goes on
serving."""

from __future__ import annotations

import base64
import io
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from tests.cluster.harness import start_linked, wait_agreed
from tests.e2e.test_openai_serving import wait_instance_ready
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(300)

IMAGE_TOKENS = {"local/tiny-vlm": 16, "local/tiny-gemma3-vlm": 22, "local/tiny-qwen2.5-vl": 6}
"""Prompt positions a 32x32 image takes: the generated towers' (32 / 8) ** 2 patches; Gemma 3
frames its soft tokens as "\n\n<start_of_image>" ... "<end_of_image>\n\n" (a token per
newline in the tiny tokenizer); Qwen2.5-VL merges 2x2 patches (4 pads) between
<|vision_start|> and <|vision_end|>."""


def data_url(colour: str) -> str:
    out = io.BytesIO()
    Image.new("RGB", (32, 32), colour).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def ask(sdk: openai.OpenAI, colour: str | None, model: str = "local/tiny-vlm", **kwargs: Any) -> Any:
    parts: list[Any] = [{"type": "text", "text": "What is this?"}]
    if colour is not None:
        parts.append({"type": "image_url", "image_url": {"url": data_url(colour)}})
    messages: Any = [{"role": "user", "content": parts}]
    return sdk.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0, **kwargs)


@pytest.mark.parametrize("model", sorted(IMAGE_TOKENS))
def test_images_reach_an_mlx_vision_model(spawn_node, model):
    (node,) = start_linked(spawn_node, ["mlx-sees"])
    wait_agreed([node], members=1)

    def placed() -> httpx.Response | None:
        response = httpx.post(node.url + "/place_instance", json={"modelId": model}, timeout=10)
        return None if response.status_code == 503 else response

    response: Any = wait_for(placed, timeout_s=60, interval_s=0.5, what="the MLX VLM placed")
    assert response.status_code == 200, response.text
    body = wait_instance_ready(node, response.json()["instanceId"], timeout_s=240)
    assert len(body["shards"]) == 1 and body["shards"][0]["backend"].startswith("mlx")

    sdk = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    plain, black, white = (ask(sdk, colour, model) for colour in (None, "black", "white"))
    grown = black.usage.prompt_tokens - plain.usage.prompt_tokens
    images = IMAGE_TOKENS[model]
    assert images <= grown <= images + 2, (plain.usage, black.usage)  # + the parts' separator
    assert white.usage.prompt_tokens == black.usage.prompt_tokens
    assert black.choices[0].message.content != white.choices[0].message.content
    assert ask(sdk, "black", model).choices[0].message.content == black.choices[0].message.content

    messages: Any = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                  {"type": "image_url", "image_url": {"url": data_url("black")}}]}]
    stream = sdk.chat.completions.create(model=model, max_tokens=8, temperature=0, stream=True,
                                         stream_options={"include_usage": True}, messages=messages)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == black.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == black.usage.prompt_tokens

    # The vision path samples plainly: logprobs are refused by name, before any runner queues.
    with pytest.raises(openai.BadRequestError) as refused:
        ask(sdk, "black", model, logprobs=True)
    assert "logprobs" in str(refused.value) and "vision path" in str(refused.value)
    assert ask(sdk, "white", model).choices[0].message.content == white.choices[0].message.content
