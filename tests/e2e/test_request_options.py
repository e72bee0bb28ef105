"""Structured output, sampling options, several choices, CORS and errors-before-the-stream
through the official SDKs against a real node serving the generated tiny GGUF on llama.cpp.

The tiny model writes random text and never stops of its own accord; under a response
format's grammar it can only end once the document is complete, so what must hold is that
the answer parses and validates whatever was drawn. Bounded schemas (maxLength) keep every
document within max_tokens. Penalties and logit bias are checked by the way they move
greedy output (a bias of -100 bans the greedy first token; +100 forces a token).
"""

from __future__ import annotations

import json

import httpx
import jsonschema_rs
import ollama
import openai
import pytest
from pydantic import BaseModel, Field

from tests.cluster.harness import start_linked, wait_agreed
from tests.e2e.test_openai_serving import MODEL, client, place, wait_instance_ready

pytestmark = pytest.mark.timeout(300)

ASK = [{"role": "user", "content": "Describe a person."}]


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int
    tags: list[str] = Field(max_length=2)


TAGGED = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10}, "sunny": {"type": "boolean"}}, "required": ["city", "sunny"]}


@pytest.fixture
def serving_node(spawn_node):
    (node,) = start_linked(spawn_node, ["solo"])
    wait_agreed([node], members=1)
    wait_instance_ready(node, place(node)["instanceId"])
    return node


def test_structured_output_through_every_sdk(serving_node):
    sdk = client(serving_node)
    for seed in range(3):
        parsed = sdk.chat.completions.parse(model=MODEL, messages=ASK, response_format=Person, max_tokens=200,
                                            temperature=1.0, seed=seed)
        choice = parsed.choices[0]
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person), choice.message.content

    # json_object: random text almost never closes a string, so the quote and the closing
    # brace are favoured with logit_bias (a real feature too); the grammar makes the end an object.
    quote, brace = token_of('"'), token_of("}")
    reply = sdk.chat.completions.create(model=MODEL, messages=ASK, response_format={"type": "json_object"},
                                        max_tokens=300, temperature=1.0, seed=1,
                                        logit_bias={str(quote): 10, str(brace): 10})
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)

    # The Responses API's text.format, streamed.
    with sdk.responses.stream(model=MODEL, input="A person?", text_format=Person, max_output_tokens=200,
                              temperature=1.0) as stream:
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, Person)

    local = ollama.Client(host=serving_node.url + "/ollama")
    for stream in (False, True):
        if stream:
            text = "".join(part.message.content for part in local.chat(
                model=MODEL, messages=ASK, format=TAGGED, stream=True, options={"num_predict": 120, "seed": 2}))
        else:
            text = local.chat(model=MODEL, messages=ASK, format=TAGGED, options={"num_predict": 120}).message.content
        assert jsonschema_rs.validator_for(TAGGED).is_valid(json.loads(text)), text

    # A schema no grammar can enforce is a 400 naming the keyword, before anything runs.
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model=MODEL, messages=ASK, response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {"id": {"type": "string", "pattern": "^a"}}}}})
    assert caught.value.code == "unsupported_schema" and "'pattern'" in caught.value.message


def token_of(text: str) -> int:
    """The id of the one token `text` is in the tiny models' vocabulary (their tokenizer is
    trained deterministically, so this matches the GGUF the node generated)."""
    from skulk.models.tiny_models import TINY_SPEC, train_tokenizer

    (token,) = train_tokenizer(TINY_SPEC).encode(text, add_special_tokens=False).ids
    return token


PROMPT = "The weather today is"
LONG_PROMPT = "the the the the"


def distinct_tokens(sdk, **options) -> int:
    reply = sdk.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=64, temperature=0, logprobs=0,
                                   **options)
    return len(set(reply.choices[0].logprobs.tokens))


def test_sampling_options_n_cors_and_errors_before_the_stream(serving_node):
    sdk = client(serving_node)

    # logit_bias: -100 bans the greedy first token, +100 forces another one every time.
    greedy = sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0).choices[0].text
    first = token_of_text_prefix(greedy)
    banned = sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                    logit_bias={str(first): -100}).choices[0].text
    assert banned != greedy
    forced = sdk.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0,
                                         logit_bias={str(token_of("}")): 100})
    assert forced.choices[0].message.content == "}}}}"

    # Penalties: a positive one makes greedy output more varied, a negative one less.
    plain = distinct_tokens(sdk)
    assert distinct_tokens(sdk, frequency_penalty=2.0) > plain
    assert distinct_tokens(sdk, presence_penalty=2.0) > plain
    assert distinct_tokens(sdk, frequency_penalty=-2.0) < plain
    local = ollama.Client(host=serving_node.url + "/ollama")
    repeated = local.generate(model=MODEL, prompt=LONG_PROMPT, raw=True, options={"num_predict": 64, "temperature": 0})
    varied = local.generate(model=MODEL, prompt=LONG_PROMPT, raw=True,
                            options={"num_predict": 64, "temperature": 0, "repeat_penalty": 1.8})
    assert varied.response != repeated.response

    # n=2: two choices, each a whole generation.
    two = sdk.chat.completions.create(model=MODEL, messages=ASK, n=2, max_tokens=5, temperature=1.0, seed=3)
    assert [c.index for c in two.choices] == [0, 1] and two.usage.completion_tokens == 10
    assert all(c.finish_reason == "length" for c in two.choices)

    # echo with logprobs: the prompt's tokens scored first (llama.cpp evaluates logits at
    # every prompt position), then the completion's.
    echoed = sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=2)
    (choice,) = echoed.choices
    scored = choice.logprobs
    assert choice.text.startswith(PROMPT) and len(scored.tokens) > 3
    assert "".join(scored.tokens[:-3]).strip() == PROMPT
    assert all(lp is not None and lp <= 0 for lp in scored.token_logprobs)
    assert scored.text_offset[-3] == len(PROMPT) and scored.text_offset == sorted(scored.text_offset)

    # A prompt longer than the context, streamed: a 400 before any byte of stream.
    long_text = "weather " * 3000
    with httpx.stream("POST", serving_node.url + "/v1/chat/completions", timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": long_text}], "stream": True}) as reply:
        assert reply.status_code == 400
        body = json.loads(reply.read())
    assert body["error"]["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long_text}], stream=True)
    assert caught.value.code == "context_length_exceeded"

    # CORS: a page on this machine may call the node; one from elsewhere may not.
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    local_page = httpx.options(serving_node.url + "/v1/chat/completions",
                               headers={"Origin": "http://localhost:3000", **preflight})
    assert local_page.status_code == 200
    assert local_page.headers["access-control-allow-origin"] == "http://localhost:3000"
    foreign = httpx.options(serving_node.url + "/v1/chat/completions",
                            headers={"Origin": "http://192.0.2.7:3000", **preflight})
    assert foreign.status_code == 400 and "access-control-allow-origin" not in foreign.headers


def token_of_text_prefix(text: str) -> int:
    """The id of the first token of `text` as the tiny tokenizer splits it."""
    from skulk.models.tiny_models import TINY_SPEC, train_tokenizer

    return train_tokenizer(TINY_SPEC).encode(text, add_special_tokens=False).ids[0]


def test_anthropic_count_tokens_start_usage_and_stop_sequence(serving_node):
    import anthropic

    claude = anthropic.Anthropic(base_url=serving_node.url, api_key="unused", max_retries=0, timeout=60)
    request = {"model": MODEL, "system": "Be brief.", "messages": [{"role": "user", "content": "The weather today is"}]}
    counted = claude.messages.count_tokens(**request).input_tokens
    free = claude.messages.create(max_tokens=12, extra_body={"temperature": 0}, **request)
    # Prompt tokens the engine's prefix cache served are cache reads, apart from input_tokens
    # (as Anthropic counts): together they are the counted prompt.
    assert counted == free.usage.input_tokens + free.usage.cache_read_input_tokens and free.usage.input_tokens > 0
    assert free.usage.cache_creation_input_tokens == 0

    with claude.messages.stream(max_tokens=12, extra_body={"temperature": 0}, **request) as stream:
        events = list(stream)
    assert events[0].type == "message_start" and events[0].message.usage.input_tokens == counted

    stop = free.content[0].text[3:6]  # greedy output is the same again, so it will meet this
    stopped = claude.messages.create(max_tokens=12, extra_body={"temperature": 0}, stop_sequences=["qqqq", stop],
                                     **request)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    assert stop not in stopped.content[0].text


def test_responses_tools_stored_conversations_and_ollama_without_content_type(serving_node):
    sdk = client(serving_node)
    weather = {"type": "function", "name": "get_weather", "description": "Weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
                              "required": ["city"], "additionalProperties": False}}
    # A forced call is decoded under the tool grammar: the tiny model writes a valid call.
    first = sdk.responses.create(model=MODEL, input="Weather in Paris?", tools=[weather], max_output_tokens=80,
                                 tool_choice={"type": "function", "name": "get_weather"})
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)

    answer = sdk.responses.create(model=MODEL, previous_response_id=first.id, tools=[weather], max_output_tokens=6,
                                  input=[{"type": "function_call_output", "call_id": call.call_id,
                                          "output": "sunny, 21 C"}])
    assert answer.status == "incomplete" and answer.output_text  # the tiny model runs to the limit
    assert answer.usage.input_tokens > first.usage.input_tokens  # the stored turns came along
    assert sdk.responses.retrieve(answer.id).output_text == answer.output_text

    # Ollama's own curl example: a JSON body without a Content-Type header.
    body = json.dumps({"model": MODEL, "prompt": "Why is the sky blue?", "stream": False,
                       "options": {"num_predict": 4}}).encode()
    reply = httpx.post(serving_node.url + "/ollama/api/generate", content=body, timeout=60)  # no Content-Type
    assert reply.status_code == 200 and reply.json()["done"] and reply.json()["eval_count"] == 4
