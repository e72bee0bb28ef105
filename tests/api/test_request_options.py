"""Request options at the API, in-process with a scripted runner: structured output in every
wire format's spelling, penalties and logit bias reach the runner normalised; a schema no
grammar can enforce is a 400 naming the keyword; and a feature the placed engine lacks (the
engine traits table) is a 400 naming feature and engine, before anything reaches the cluster.
That the llama.cpp engine then honours them is tested against the tiny GGUF
(tests/worker/engines/test_llama_cpp_sampling.py) and end to end (tests/e2e/)."""

from __future__ import annotations

import json

import ollama
import openai
import pytest
from pydantic import BaseModel, Field

from skulk.api import request_options
from skulk.api.errors import InvalidRequest
from skulk.shared.types.commands import GenerateText
from skulk.shared.types.engines import ENGINE_TRAITS, Feature
from skulk.shared.types.instances import Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import State
from skulk.shared.types.tasks import ResponseFormat
from tests.api.scripted_cluster import asgi_http, scripted_app
from tests.api.test_openai_routes import MODEL
from tests.api.test_tools_sdk import WEATHER_TOOL, ollama_sdk, openai_sdk

ASK = [{"role": "user", "content": "Who?"}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def served_by(backend: str, world: int = 1, sharding: str = "Pipeline") -> State:
    instance = Instance(
        instance_id="i1", model_id=MODEL, sharding=sharding, context_token_limit=2048,
        shards=[ShardAssignment(node_id=f"n{r}", runner_id=f"r{r}", rank=r, world_size=world, start_layer=r * 3,
                                end_layer=r * 3 + 3 if world > 1 else 6, backend=backend) for r in range(world)],
    )
    return State(instances={"i1": instance}, runners={f"r{r}": RunnerStatus(state="Ready") for r in range(world)})


# -- reading each wire format's spelling ---------------------------------------------------

JSON_OBJECT = ResponseFormat(type="json_object")


@pytest.mark.parametrize(("read", "value", "expected"), [
    (request_options.openai_response_format, None, None),
    (request_options.openai_response_format, {"type": "text"}, None),
    (request_options.openai_response_format, {"type": "json_object"}, JSON_OBJECT),
    (request_options.openai_response_format, {"type": "json_object", "schema": None}, JSON_OBJECT),
    # llama-server's extension: a json_object's schema is enforced like a json_schema
    (request_options.openai_response_format, {"type": "json_object", "schema": SCHEMA},
     ResponseFormat(type="json_schema", name="json_object", json_schema=SCHEMA)),
    (request_options.openai_response_format,
     {"type": "json_schema", "json_schema": {"name": "who", "schema": SCHEMA, "strict": True}},
     ResponseFormat(type="json_schema", name="who", json_schema=SCHEMA)),
    (request_options.responses_text_format, {"type": "json_schema", "name": "who", "schema": SCHEMA},
     ResponseFormat(type="json_schema", name="who", json_schema=SCHEMA)),
    (request_options.responses_text_format, {"type": "text"}, None),
    (request_options.ollama_format, "", None),
    (request_options.ollama_format, "json", JSON_OBJECT),
    (request_options.ollama_format, SCHEMA, ResponseFormat(type="json_schema", name="format", json_schema=SCHEMA)),
])
def test_each_spelling_of_structured_output_reads_the_same(read, value, expected):
    assert read(value) == expected


@pytest.mark.parametrize(("read", "value", "param"), [
    (request_options.openai_response_format, {"type": "xml"}, "response_format.type"),
    (request_options.openai_response_format, {"type": "json_object", "schema": "x"}, "response_format.schema"),
    (request_options.openai_response_format, {"type": "json_object", "schema": {"type": "integer", "minimum": 3}},
     "response_format.schema.minimum"),
    (request_options.openai_response_format, {"type": "json_schema"}, "response_format.json_schema"),
    (request_options.openai_response_format, {"type": "json_schema", "json_schema": {"name": "x"}},
     "response_format.json_schema.schema"),
    (request_options.openai_response_format,
     {"type": "json_schema", "json_schema": {"name": "x", "schema": {
         "type": "object", "properties": {"id": {"type": "string", "pattern": "^a"}}}}},
     "response_format.json_schema.schema.properties.id.pattern"),
    (request_options.responses_text_format, {"type": "json_schema", "schema": {"type": "string", "format": "date"}},
     "text.format.schema.format"),
    (request_options.ollama_format, "yaml", "format"),
    (request_options.ollama_format, {"type": "integer", "minimum": 3}, "format.minimum"),
])
def test_a_bad_or_unenforceable_format_names_its_parameter(read, value, param):
    with pytest.raises(InvalidRequest) as caught:
        read(value)
    assert caught.value.param == param


@pytest.mark.parametrize(("value", "expected"), [
    (None, {}), ({}, {}), ({"12": -100, "7": 5.5}, {12: -100.0, 7: 5.5}),
])
def test_logit_bias_reads_token_ids(value, expected):
    assert request_options.logit_bias(value) == expected


@pytest.mark.parametrize("value", [{"x": 1}, {"-1": 1}, {"3": 101}, {"3": float("nan")}])
def test_a_bad_logit_bias_is_refused(value):
    with pytest.raises(InvalidRequest) as caught:
        request_options.logit_bias(value)
    assert caught.value.param == "logit_bias"


@pytest.mark.parametrize(("read", "value", "ok"), [
    (request_options.penalty, 2.0, True), (request_options.penalty, -2.0, True),
    (request_options.penalty, 2.5, False), (request_options.penalty, float("nan"), False),
    (request_options.repeat_penalty, 1.1, True), (request_options.repeat_penalty, 0.0, False),
])
def test_penalty_ranges(read, value, ok):
    if ok:
        assert read(value, "p") == value
    else:
        with pytest.raises(InvalidRequest):
            read(value, "p")


# -- the engine traits table at the API ------------------------------------------------------

FEATURE_REQUESTS = {
    Feature.LOGPROBS: ({"logprobs": True}, "logprobs"),
    Feature.STRUCTURED_OUTPUT: ({"response_format": {"type": "json_object"}}, "response_format"),
    Feature.FORCED_TOOL_CALLS: ({"tools": [WEATHER_TOOL], "tool_choice": "required"}, "tool_choice"),
    Feature.PENALTIES: ({"presence_penalty": 0.5}, "presence_penalty"),
    Feature.LOGIT_BIAS: ({"logit_bias": {"5": 10}}, "logit_bias"),
}
"""A chat request field asking for each feature, and the parameter a refusal names."""

CASES = [(engine, feature) for engine in sorted(ENGINE_TRAITS) if "text" in ENGINE_TRAITS[engine].workloads
         for feature in FEATURE_REQUESTS]
"""Engines that generate text (a speech engine refuses chat as a whole, `bind_instance`)."""


@pytest.mark.parametrize(("engine", "feature"), CASES)
async def test_a_feature_the_engine_lacks_is_refused_naming_feature_and_engine(engine, feature):
    app, cluster = scripted_app(['{"name": "Al"}'], state=served_by(f"{engine}-cpu"))
    fields, param = FEATURE_REQUESTS[feature]
    async with asgi_http(app) as http:
        reply = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, **fields})
    sent = [c for c in cluster.commands if isinstance(c, GenerateText)]
    if feature in ENGINE_TRAITS[engine].features:
        assert reply.status_code == 200 and len(sent) == 1
    else:
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "unsupported_feature" and error["param"] == param
        assert feature.value in error["message"] and f"the {engine} engine" in error["message"]
        assert not sent


@pytest.mark.parametrize(("sharding", "refused"), [("Pipeline", True), ("Tensor", False)])
async def test_an_mlx_pipeline_refuses_what_its_last_rank_cannot_sample(sharding, refused):
    """A pipeline's last rank samples without the tokenizer or the prompt; a tensor group's
    rank 0 computes the logits, so it shapes them as one rank does."""
    app, cluster = scripted_app(["x"], state=served_by("mlx-cpu", world=2, sharding=sharding))
    async with asgi_http(app) as http:
        reply = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "logprobs": True})
    if refused:
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "unsupported_feature" and error["param"] == "logprobs"
        assert "the mlx (pipeline over 2 nodes) engine" in error["message"] and not cluster.commands
    else:
        assert reply.status_code == 200, reply.text


async def test_ollama_refusals_name_ollamas_parameter():
    app, _ = scripted_app(["{}"], state=served_by("vllm-cpu"))
    with pytest.raises(ollama.ResponseError) as caught:
        await ollama_sdk(app).chat(model=MODEL, messages=ASK, format="json", stream=False)
    assert caught.value.status_code == 400
    assert "structured output" in caught.value.error and "'format'" in caught.value.error


# -- through the official SDKs -------------------------------------------------------------


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int


async def test_openai_parse_sends_the_strict_schema_and_returns_the_object():
    app, cluster = scripted_app(['{"name": "Al", ', '"age": 3}'])
    reply = await openai_sdk(app).chat.completions.parse(model=MODEL, messages=ASK, response_format=Person)
    assert reply.choices[0].message.parsed == Person(name="Al", age=3)
    sent = cluster.params().response_format
    assert sent.type == "json_schema" and sent.name == "Person"
    assert sent.json_schema["properties"]["name"]["maxLength"] == 8
    assert sent.json_schema["additionalProperties"] is False


async def test_openai_sampling_options_reach_the_runner():
    app, cluster = scripted_app(["x"])
    await openai_sdk(app).chat.completions.create(
        model=MODEL, messages=ASK, frequency_penalty=1.5, presence_penalty=-0.5, logit_bias={"42": -100},
        extra_body={"repetition_penalty": 1.2})
    params = cluster.params()
    assert (params.frequency_penalty, params.presence_penalty, params.repeat_penalty) == (1.5, -0.5, 1.2)
    assert params.logit_bias == {42: -100.0}


async def test_an_unenforceable_schema_is_a_400_naming_the_keyword():
    app, cluster = scripted_app(["{}"])
    with pytest.raises(openai.BadRequestError) as caught:
        await openai_sdk(app).chat.completions.create(model=MODEL, messages=ASK, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}}}})
    error = caught.value.body
    assert error["code"] == "unsupported_schema" and "'format'" in error["message"]
    assert error["param"] == "response_format.json_schema.schema.properties.when.format"
    assert not cluster.commands


async def test_responses_text_format_reaches_the_runner():
    app, cluster = scripted_app(['{"name": "Al"}'])
    reply = await openai_sdk(app).responses.create(model=MODEL, input="Who?", text={"format": {
        "type": "json_schema", "name": "who", "schema": SCHEMA, "strict": True}})
    assert json.loads(reply.output_text) == {"name": "Al"}
    assert reply.text.format.type == "json_schema"
    assert cluster.params().response_format == ResponseFormat(type="json_schema", name="who", json_schema=SCHEMA)


async def test_ollama_format_and_penalties_reach_the_runner():
    app, cluster = scripted_app(['{"name": "Al"}'])
    reply = await ollama_sdk(app).chat(model=MODEL, messages=ASK, format=SCHEMA, stream=False,
                                       options={"repeat_penalty": 1.3, "frequency_penalty": 0.2})
    assert json.loads(reply.message.content) == {"name": "Al"}
    params = cluster.params()
    assert params.response_format.json_schema == SCHEMA
    assert (params.repeat_penalty, params.frequency_penalty) == (1.3, 0.2)


@pytest.mark.parametrize("engine", sorted(ENGINE_TRAITS))
async def test_embeddings_follow_the_table(engine):
    app, cluster = scripted_app(vectors=lambda n: [[1.0, 0.0]] * n, state=served_by(f"{engine}-cpu"))
    async with asgi_http(app) as http:
        reply = await http.post("/v1/embeddings", json={"model": MODEL, "input": "hi"})
    if "embeddings" in ENGINE_TRAITS[engine].workloads:
        assert reply.status_code == 200, reply.text
    else:
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "unsupported_feature"
        assert f"the {engine} engine" in reply.json()["error"]["message"] and not cluster.commands


# -- several choices -------------------------------------------------------------------------


async def test_n_choices_are_separate_generations_with_consecutive_seeds():
    app, cluster = scripted_app(["Hello"])
    reply = await openai_sdk(app).chat.completions.create(model=MODEL, messages=ASK, n=3, seed=7)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content == "Hello" for c in reply.choices)
    sent = cluster.all_params()
    assert [p.seed for p in sent] == [7, 8, 9]
    # The prompt counted once, the completions of all three summed (the script reports 3 each).
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (7, 9)


async def test_n_choices_stream_interleaved_each_with_its_index_and_finish():
    app, cluster = scripted_app(["Hel", "lo"], finish="length")
    stream = await openai_sdk(app).chat.completions.create(model=MODEL, messages=ASK, n=2, seed=3, stream=True,
                                                           stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    texts: dict[int, str] = {0: "", 1: ""}
    finishes: dict[int, list[str]] = {0: [], 1: []}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason is not None:
            finishes[choice.index].append(choice.finish_reason)
    assert texts == {0: "Hello", 1: "Hello"} and finishes == {0: ["length"], 1: ["length"]}
    assert len({chunk.id for chunk in chunks}) == 1  # one response id for the request
    # The last chunk: no choices, the usage of both (the prompt once, the completions summed).
    assert chunks[-1].choices == [] and (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (7, 6)
    assert [p.seed for p in cluster.all_params()] == [3, 4]


async def test_streamed_legacy_completions_with_n_and_several_prompts():
    app, cluster = scripted_app(["Hi"])
    stream = await openai_sdk(app).completions.create(model=MODEL, prompt=["Say", "Tell"], n=2, stream=True,
                                                      echo=True)
    chunks = [chunk async for chunk in stream]
    texts: dict[int, str] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {0: "SayHi", 1: "SayHi", 2: "TellHi", 3: "TellHi"}
    # Two prompts counted once each, four completions summed.
    assert chunks[-1].choices == [] and (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (14, 12)
    assert len([c for c in cluster.commands if isinstance(c, GenerateText)]) == 4


async def test_a_streamed_choice_that_fails_before_output_is_an_http_error():
    app, _ = scripted_app(fail=("PromptTooLong", "the prompt is 9000 tokens, the context 2048"))
    with pytest.raises(openai.APIStatusError):  # raised by create: an HTTP status, not a 200 then an error event
        await openai_sdk(app).chat.completions.create(model=MODEL, messages=ASK, n=2, stream=True)


async def test_n_on_legacy_completions():
    app, cluster = scripted_app(["Hi"])
    reply = await openai_sdk(app).completions.create(model=MODEL, prompt="Say", n=2)
    assert [c.index for c in reply.choices] == [0, 1] and all(c.text == "Hi" for c in reply.choices)
    assert len([c for c in cluster.commands if isinstance(c, GenerateText)]) == 2


async def test_a_failed_choice_fails_the_request():
    app, _ = scripted_app(fail=("EngineError", "boom"))
    with pytest.raises(openai.APIError):
        await openai_sdk(app).chat.completions.create(model=MODEL, messages=ASK, n=2)


async def test_completions_take_a_prompt_array_and_echo():
    app, cluster = scripted_app(["Hi"])
    sdk = openai_sdk(app)
    reply = await sdk.completions.create(model=MODEL, prompt=["Say ", "Tell "], n=2, echo=True)
    assert [c.text for c in reply.choices] == ["Say Hi", "Say Hi", "Tell Hi", "Tell Hi"]
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    sent = [p.prompt for p in cluster.all_params()]
    assert sent == ["Say ", "Say ", "Tell ", "Tell "]
    assert reply.usage.prompt_tokens == 2 * 7 and reply.usage.completion_tokens == 4 * 3  # each prompt once
    streamed = await sdk.completions.create(model=MODEL, prompt="Say ", echo=True, stream=True)
    assert "".join([c.choices[0].text async for c in streamed if c.choices]) == "Say Hi"


async def test_echo_with_logprobs_scores_the_prompt_first():
    app, cluster = scripted_app(["Hi", "!"], logprobs=True)
    sdk = openai_sdk(app)
    reply = await sdk.completions.create(model=MODEL, prompt="Say", echo=True, logprobs=1)
    assert cluster.params().prompt_logprobs
    (choice,) = reply.choices
    assert choice.text == "SayHi!"
    scored = choice.logprobs
    assert scored.tokens == ["S", "a", "y", "Hi", "!"]
    assert scored.token_logprobs == [None, -1.0, -1.0, -0.25, -0.25]
    assert scored.top_logprobs[0] is None and scored.top_logprobs[1] == {"a": -1.0}
    assert scored.text_offset == [0, 1, 2, 3, 5]

    streamed = [c async for c in await sdk.completions.create(model=MODEL, prompt="Say", echo=True, logprobs=1,
                                                              stream=True)]
    first = streamed[0].choices[0]
    assert first.text == "Say" and first.logprobs.tokens == ["S", "a", "y"]
    assert first.logprobs.token_logprobs == [None, -1.0, -1.0]
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "SayHi!"
    offsets = [o for c in streamed if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert offsets == [0, 1, 2, 3, 5]


@pytest.mark.parametrize("backend", ["mlx-cpu", "llama_server-cpu"])
async def test_echo_with_logprobs_is_refused_where_the_engine_cannot_score_a_prompt(backend):
    app, cluster = scripted_app(["x"], state=served_by(backend))
    async with asgi_http(app) as http:
        reply = await http.post("/v1/completions", json={"model": MODEL, "prompt": "Say", "echo": True, "logprobs": 1})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "unsupported_feature" and error["param"] == "echo" and "prompt logprobs" in error["message"]
    assert not cluster.commands


@pytest.mark.parametrize(("fields", "param"), [
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"), ({"modalities": ["text", "audio"]}, "modalities"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"), ({"web_search_options": {}}, "web_search_options"),
    ({"functions": [{"name": "f"}]}, "functions"), ({"function_call": "auto"}, "function_call"),
])
async def test_openai_fields_that_would_change_the_answer_are_refused_not_ignored(fields, param):
    app, cluster = scripted_app(["x"])
    async with asgi_http(app) as http:
        reply = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, **fields})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param
    assert reply.json()["error"]["code"] == "unsupported_parameter" and not cluster.commands


async def test_text_only_modalities_are_served():
    app, _ = scripted_app(["x"])
    reply = await openai_sdk(app).chat.completions.create(model=MODEL, messages=ASK, modalities=["text"])
    assert reply.choices[0].message.content == "x"
