"""Tools, logprobs and embeddings through the official SDKs against a real node serving the
generated tiny GGUF on llama.cpp.

The tiny model writes random text and never a tool call of its own accord, so most of these
tests check what must hold whatever it writes: a tool-enabled request (with the whole call/result exchange in its
history) renders through the GGUF's chat template and comes back as a well-formed answer in
every SDK, streamed and not; the held-then-released stream carries exactly the unstreamed
text; logprobs are real numbers for the tokens sent. Parsing of real tool-call text is
covered, per format, by tests/api/test_tool_calls.py and, through the same SDKs, by
tests/api/test_tools_sdk.py. A forced tool_choice (OpenAI "required" or a named function,
Anthropic "any" or "tool") samples under a grammar, so there the tiny model does write a real
call, which must come back parsed with arguments valid for the tool's schema. Ollama has no
tool_choice, so it has no forced call to test.
"""

from __future__ import annotations

import json
import math

import anthropic
import jsonschema_rs
import ollama
import openai
import pytest

from tests.cluster.harness import start_linked, wait_agreed
from tests.e2e.test_openai_serving import MODEL, client, place, wait_instance_ready

pytestmark = pytest.mark.timeout(300)

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}
ASK = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "sunny and 21 degrees"}


FORCED_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        # Bounded, so a random model's call always fits max_tokens.
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False},
    }},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current time in a zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8},
                                                        "offset_hours": {"type": "integer"}},
                       "required": ["zone"]},
    }},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in FORCED_TOOLS}
FORCED_MAX_TOKENS = 120


def assert_valid_call(name: str, arguments: dict, allowed: set[str]) -> None:
    assert name in allowed
    assert jsonschema_rs.validator_for(SCHEMAS[name]).is_valid(arguments), (name, arguments)


@pytest.fixture
def serving_node(spawn_node):
    (node,) = start_linked(spawn_node, ["solo"])
    wait_agreed([node], members=1)
    wait_instance_ready(node, place(node)["instanceId"])
    return node


def test_tool_requests_through_every_sdk(serving_node):
    sdk = client(serving_node)
    first = sdk.chat.completions.create(model=MODEL, messages=[ASK], tools=[WEATHER_TOOL], max_tokens=10,
                                        temperature=0)
    choice = first.choices[0]
    # Prose (the tiny model's only kind of answer) comes back as content, not as a call.
    assert choice.finish_reason == "length" and choice.message.content and choice.message.tool_calls is None
    assert first.usage.completion_tokens == 10

    # The round trip: the call and its result are rendered into the prompt (it grows by
    # the result's tokens) and the model answers again.
    second = sdk.chat.completions.create(model=MODEL, messages=[ASK, CALL, RESULT], tools=[WEATHER_TOOL],
                                         tool_choice="auto", max_tokens=10, temperature=0)
    assert second.choices[0].finish_reason == "length"
    assert second.usage.prompt_tokens > first.usage.prompt_tokens

    # A streamed tool request is held until the end and parsed once, then released as a
    # valid stream carrying exactly the unstreamed text.
    chunks = list(sdk.chat.completions.create(model=MODEL, messages=[ASK], tools=[WEATHER_TOOL], max_tokens=10,
                                              temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

    claude = anthropic.Anthropic(base_url=serving_node.url, api_key="unused", max_retries=0, timeout=60)
    message = claude.messages.create(
        model=MODEL, max_tokens=10,
        tools=[{"name": "get_weather", "description": "Current weather in a city",
                "input_schema": WEATHER_TOOL["function"]["parameters"]}],
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": "sunny and 21 degrees"}]},
        ],
    )
    assert message.stop_reason == "max_tokens" and message.content[0].type == "text"
    assert message.usage.output_tokens == 10

    local = ollama.Client(host=serving_node.url + "/ollama")
    reply = local.chat(model=MODEL, tools=[WEATHER_TOOL], options={"num_predict": 10, "temperature": 0}, messages=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny and 21 degrees", "tool_name": "get_weather"},
    ])
    assert reply.done and reply.done_reason == "length" and reply.eval_count == 10
    assert not reply.message.tool_calls


def test_logprobs_from_the_llama_cpp_engine(serving_node):
    sdk = client(serving_node)
    reply = sdk.chat.completions.create(model=MODEL, messages=[ASK], max_tokens=6, temperature=0,
                                        logprobs=True, top_logprobs=3)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == 6
    for entry in entries:
        assert entry.logprob <= 0 and math.isfinite(entry.logprob)
        assert len(entry.top_logprobs) == 3
        # Greedy decoding picks the most likely token.
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-4)
    legacy = sdk.completions.create(model=MODEL, prompt="The weather today is", max_tokens=4, temperature=0,
                                    logprobs=2)
    assert len(legacy.choices[0].logprobs.token_logprobs) == 4


def test_embeddings_with_the_openai_and_ollama_sdks(serving_node):
    sdk = openai.OpenAI(base_url=serving_node.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    reply = sdk.embeddings.create(model=MODEL, input=["hello world", "a sentence about cats"])  # base64 by default
    first, second = (d.embedding for d in reply.data)
    assert len(first) == len(second) > 0
    assert math.isclose(math.sqrt(sum(x * x for x in first)), 1.0, rel_tol=1e-4)
    assert first != second and reply.usage.prompt_tokens > 0
    again = sdk.embeddings.create(model=MODEL, input="hello world", encoding_format="float", dimensions=16)
    assert len(again.data[0].embedding) == 16
    assert json.dumps(again.data[0].embedding)  # plain floats
    local = ollama.Client(host=serving_node.url + "/ollama", timeout=30)
    embedded = local.embed(model=MODEL, input="hello world")
    assert embedded.embeddings[0] == pytest.approx(first, abs=1e-5)


def test_forced_tool_calls_are_real_calls_in_the_openai_and_anthropic_sdks(serving_node):
    sdk = client(serving_node)
    for choice, allowed in [("required", {"get_weather", "get_time"}),
                            ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})]:
        for seed in (1, 2):
            reply = sdk.chat.completions.create(model=MODEL, messages=[ASK], tools=FORCED_TOOLS, tool_choice=choice,
                                                max_tokens=FORCED_MAX_TOKENS, seed=seed)
            choice_ = reply.choices[0]
            assert choice_.finish_reason == "tool_calls" and not choice_.message.content
            (call,) = choice_.message.tool_calls
            assert call.type == "function" and call.id
            assert_valid_call(call.function.name, json.loads(call.function.arguments), allowed)
        # Streamed: the same call, assembled once, in the stream's delta form.
        chunks = list(sdk.chat.completions.create(model=MODEL, messages=[ASK], tools=FORCED_TOOLS, tool_choice=choice,
                                                  max_tokens=FORCED_MAX_TOKENS, temperature=0, stream=True))
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        (delta,) = deltas
        assert_valid_call(delta.function.name, json.loads(delta.function.arguments), allowed)
        unstreamed = sdk.chat.completions.create(model=MODEL, messages=[ASK], tools=FORCED_TOOLS, tool_choice=choice,
                                                 max_tokens=FORCED_MAX_TOKENS, temperature=0)
        (call,) = unstreamed.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == (
            delta.function.name, json.loads(delta.function.arguments))

    claude = anthropic.Anthropic(base_url=serving_node.url, api_key="unused", max_retries=0, timeout=60)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in FORCED_TOOLS]
    for choice, allowed in [({"type": "any"}, {"get_weather", "get_time"}),
                            ({"type": "tool", "name": "get_weather"}, {"get_weather"})]:
        message = claude.messages.create(model=MODEL, max_tokens=FORCED_MAX_TOKENS, tools=tools, tool_choice=choice,
                                         messages=[{"role": "user", "content": "What is the weather in Paris?"}])
        assert message.stop_reason == "tool_use"
        (block,) = [b for b in message.content if b.type == "tool_use"]
        assert block.id
        assert_valid_call(block.name, block.input, allowed)
        with claude.messages.stream(model=MODEL, max_tokens=FORCED_MAX_TOKENS, tools=tools, tool_choice=choice,
                                    messages=[{"role": "user", "content": "Weather?"}]) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "tool_use"
        (block,) = [b for b in final.content if b.type == "tool_use"]
        assert_valid_call(block.name, block.input, allowed)

    # A forced tool whose schema no grammar can enforce: a 400 in each caller's shape, not a 5xx.
    odd = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=MODEL, messages=[ASK], tool_choice="required", max_tokens=8,
                                    tools=[{"type": "function", "function": {"name": "odd", "parameters": odd}}])
    assert refused.value.body["param"] == "tools[0].function.parameters"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL, max_tokens=8, tool_choice={"type": "any"},
                               tools=[{"name": "odd", "input_schema": odd}],
                               messages=[{"role": "user", "content": "Weather?"}])


def test_token_array_embeddings_with_the_openai_sdk(serving_node):
    sdk = openai.OpenAI(base_url=serving_node.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    reply = sdk.embeddings.create(model=MODEL, input=[[5, 6, 7, 8], [9, 10]], encoding_format="float")
    first, second = (d.embedding for d in reply.data)
    assert len(first) == len(second) > 0 and first != second
    assert math.isclose(math.sqrt(sum(x * x for x in first)), 1.0, rel_tol=1e-4)
    assert reply.usage.prompt_tokens == 6
    single = sdk.embeddings.create(model=MODEL, input=[5, 6, 7, 8])  # one token array, base64 by default
    assert single.data[0].embedding == pytest.approx(first, abs=1e-5)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model=MODEL, input=[[1, 2], [10**6]])
    assert "vocabulary" in refused.value.message
