"""Anthropic details clients read: count_tokens (equal to the input usage the same request
reports), real input tokens in `message_start`, the stop sequence that matched, and the
prompt-cache usage fields (always 0: Skulk has no client-controlled prompt cache)."""

from __future__ import annotations

import pytest

from skulk.shared.types.instances import Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import State
from tests.api.scripted_cluster import USAGE, scripted_app
from tests.api.test_openai_routes import MODEL
from tests.api.test_tools_sdk import anthropic_sdk

ASK = [{"role": "user", "content": "hi"}]
TOOLS = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


async def test_count_tokens_sends_a_count_only_request_rendered_like_the_message():
    app, cluster = scripted_app([""])
    sdk = anthropic_sdk(app)
    counted = await sdk.messages.count_tokens(model=MODEL, messages=ASK, system="Be brief.", tools=TOOLS,
                                              tool_choice={"type": "any"})
    assert counted.input_tokens == USAGE.prompt_tokens
    sent = cluster.params()
    assert sent.count_only and sent.max_tokens == 1
    assert sent.messages[0].content == "Be brief." and sent.tools[0].name == "get_weather"
    message = await sdk.messages.create(model=MODEL, max_tokens=8, messages=ASK, system="Be brief.", tools=TOOLS)
    assert message.usage.input_tokens == counted.input_tokens
    second = cluster.all_params()[1]
    assert second.messages == sent.messages and not second.count_only


async def test_count_tokens_works_on_engines_without_generation_features():
    # vllm honours no forced tool calls, yet counting the same request is fine.
    vllm = Instance(instance_id="i1", model_id=MODEL, sharding="Pipeline", context_token_limit=2048, shards=[
        ShardAssignment(node_id="n1", runner_id="r1", rank=0, world_size=1, start_layer=0, end_layer=6,
                        backend="vllm-cpu")])
    app, _ = scripted_app([""], state=State(instances={"i1": vllm}, runners={"r1": RunnerStatus(state="Ready")}))
    counted = await anthropic_sdk(app).messages.count_tokens(model=MODEL, messages=ASK, tools=TOOLS,
                                                            tool_choice={"type": "any"})
    assert counted.input_tokens == USAGE.prompt_tokens


async def test_message_start_reports_the_real_input_tokens_and_cache_fields():
    app, _ = scripted_app(["Hel", "lo"])
    async with anthropic_sdk(app).messages.stream(model=MODEL, max_tokens=8, messages=ASK) as stream:
        events = [event async for event in stream]
    start = events[0]
    assert start.type == "message_start"
    assert start.message.usage.input_tokens == USAGE.prompt_tokens
    assert start.message.usage.cache_read_input_tokens == 0 and start.message.usage.cache_creation_input_tokens == 0
    final = await stream.get_final_message()
    assert final.usage.input_tokens == USAGE.prompt_tokens


@pytest.mark.parametrize("stream", [False, True])
async def test_the_matched_stop_sequence_is_reported(stream):
    app, _ = scripted_app(["Hel", "lo"], stop_sequence="END")
    sdk = anthropic_sdk(app)
    if stream:
        async with sdk.messages.stream(model=MODEL, max_tokens=8, messages=ASK, stop_sequences=["END", "##"]) as s:
            message = await s.get_final_message()
    else:
        message = await sdk.messages.create(model=MODEL, max_tokens=8, messages=ASK, stop_sequences=["END", "##"])
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")
    assert message.content[0].text == "Hello"
