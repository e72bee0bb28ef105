"""The MLX engine honours what llama.cpp does, through the official SDKs against a real node
serving the generated tiny Llama on MLX (one rank): `.parse()` with a pydantic model, JSON
mode, an Ollama schema, a forced tool call, logprobs, logit bias and penalties. The same
checks as tests/e2e/test_request_options.py make on the tiny GGUF; the tokenizer is the same
deterministic one, so token ids carry over."""

from __future__ import annotations

import json

import httpx
import jsonschema_rs
import ollama
import openai
import pytest

from tests.cluster.harness import start_linked, wait_agreed
from tests.e2e.test_openai_serving import client, wait_instance_ready
from tests.e2e.test_request_options import ASK, LONG_PROMPT, PROMPT, TAGGED, Person, token_of, token_of_text_prefix

pytestmark = pytest.mark.timeout(300)

MODEL = "local/tiny-llama"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}}}


@pytest.fixture
def mlx_node(spawn_node):
    (node,) = start_linked(spawn_node, ["mlx-solo"])
    wait_agreed([node], members=1)
    response = httpx.post(node.url + "/place_instance", json={"modelId": MODEL}, timeout=10)
    assert response.status_code == 200, response.text
    placed = response.json()
    assert placed["preview"]["shards"][0]["backend"].startswith("mlx"), placed
    wait_instance_ready(node, placed["instanceId"])
    return node


def distinct_tokens(sdk, **options) -> int:
    reply = sdk.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=64, temperature=0, logprobs=0,
                                   **options)
    return len(set(reply.choices[0].logprobs.tokens))


def test_mlx_honours_structured_output_tools_logprobs_bias_and_penalties(mlx_node):
    sdk = client(mlx_node)

    for seed in range(2):
        parsed = sdk.chat.completions.parse(model=MODEL, messages=ASK, response_format=Person, max_tokens=200,
                                            temperature=1.0, seed=seed)
        choice = parsed.choices[0]
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person), choice.message.content

    reply = sdk.chat.completions.create(model=MODEL, messages=ASK, response_format={"type": "json_object"},
                                        max_tokens=300, temperature=1.0, seed=1,
                                        logit_bias={str(token_of('"')): 10, str(token_of("}")): 10})
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)

    text = ollama.Client(host=mlx_node.url + "/ollama").chat(
        model=MODEL, messages=ASK, format=TAGGED, options={"num_predict": 120}).message.content
    assert jsonschema_rs.validator_for(TAGGED).is_valid(json.loads(text)), text

    forced = sdk.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=100,
                                         tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = forced.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)

    scored = sdk.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0, logprobs=True,
                                         top_logprobs=2)
    entries = scored.choices[0].logprobs.content
    assert len(entries) == 4
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-4)  # greedy: the best

    greedy = sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0).choices[0].text
    banned = sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                    logit_bias={str(token_of_text_prefix(greedy)): -100}).choices[0].text
    assert banned != greedy
    pushed = sdk.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0,
                                         logit_bias={str(token_of("}")): 100})
    assert pushed.choices[0].message.content == "}}}}"

    # n=2 streamed: the choices' chunks interleave, each with its index and its own finish.
    chunks = list(sdk.chat.completions.create(model=MODEL, messages=ASK, n=2, max_tokens=5, temperature=1.0, seed=3,
                                              stream=True, stream_options={"include_usage": True}))
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices and
                c.choices[0].finish_reason}
    assert finishes == {0: "length", 1: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10

    # Prompt logprobs (echo with logprobs): the MLX stage computes the head for the last
    # position only, so it is refused by name, never ignored.
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, echo=True, logprobs=2)
    assert caught.value.code == "unsupported_feature" and caught.value.param == "echo"

    plain = distinct_tokens(sdk)
    assert distinct_tokens(sdk, frequency_penalty=2.0) > plain
    assert distinct_tokens(sdk, frequency_penalty=-2.0) < plain
