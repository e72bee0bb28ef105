"""Anthropic's `thinking.budget_tokens` is a hard cap on a real node: a reasoning model (the
tiny GGUF with a template that opens the think block; the random model never closes it) asked
to think within a budget thinks exactly that long, then answers, on the in-process llama.cpp
engine and on llama-server. The cut, the continuation and its prompt are unit-tested in
tests/api/test_thinking_budget.py and per engine beside each engine's tests."""

from __future__ import annotations

import anthropic
import pytest

from tests.cluster.test_any_architecture import add_local, place
from tests.llama_server_kit import require_llama_server
from tests.worker.tiny_gguf import THINKING_TEMPLATE, tiny_gguf, with_chat_template  # noqa: F401

pytestmark = pytest.mark.timeout(300)

BUDGET = 1024
MAX_TOKENS = 1100
SLACK_DELTAS = 16
"""Thinking deltas that may merge with the next (a '<' held until the next token shows it
starts no `</think>`)."""


@pytest.mark.parametrize("engine", ["llama_cpp", "llama_server"])
def test_reasoning_stops_at_the_budget_and_the_model_answers(spawn_node, tmp_path, tiny_gguf, engine):
    env = {"SKULK_NO_ENGINE_AUTOPROVISION": "1", "SKULK_MODELS_LOCAL_DIRS": str(tmp_path / "models")}
    if engine == "llama_server":
        env["SKULK_LLAMA_SERVER_BIN"] = str(require_llama_server())
    (tmp_path / "models").mkdir()
    path = with_chat_template(tiny_gguf, tmp_path / "models" / "tiny-thinker.gguf", THINKING_TEMPLATE)
    node = spawn_node("thinker", env=env).wait_ready()
    card = add_local(node, path)
    assert card["reasoning"]["format"] == "think_tags" and card["reasoning"]["switches"] == ["enable_thinking"]
    instance_id = place(node, card["modelId"])
    shards = node.get("/state").json()["instances"][instance_id]["shards"]
    assert [s["backend"].split("-")[0] for s in shards] == [engine]

    claude = anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0, timeout=120)
    request = {"model": card["modelId"], "max_tokens": MAX_TOKENS, "extra_body": {"temperature": 0},
               "messages": [{"role": "user", "content": "Think about the weather."}]}
    unbounded = claude.messages.create(**request)
    # Without a budget the model thinks until max_tokens: there is no answer.
    assert unbounded.content[0].type == "thinking" and unbounded.stop_reason == "max_tokens"
    assert not "".join(b.text for b in unbounded.content if b.type == "text")

    capped = claude.messages.create(**request, thinking={"type": "enabled", "budget_tokens": BUDGET})
    thinking, text = capped.content
    assert (thinking.type, text.type) == ("thinking", "text") and text.text
    assert len(thinking.thinking) < len(unbounded.content[0].thinking)
    # The answer took the rest of max_tokens; the prompt is counted once.
    assert capped.usage.output_tokens == MAX_TOKENS and capped.stop_reason == "max_tokens"
    prompt = unbounded.usage.input_tokens + unbounded.usage.cache_read_input_tokens
    assert capped.usage.input_tokens + capped.usage.cache_read_input_tokens == prompt
    if engine == "llama_cpp":  # one sequence at a time: greedy output is reproducible to the token
        assert unbounded.content[0].thinking.startswith(thinking.thinking)

    # Streamed, each sampled token of the thought is one thinking delta (a delta holding
    # back the start of a possible tag joins the next): the budget's tokens, less the
    # template's `<think>`, and not one more.
    with claude.messages.stream(**request, thinking={"type": "enabled", "budget_tokens": BUDGET}) as stream:
        deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
        streamed = stream.get_final_message()
    assert BUDGET - 1 - SLACK_DELTAS <= deltas.count("thinking_delta") <= BUDGET - 1
    assert deltas.index("text_delta") == deltas.count("thinking_delta")  # all thought, then all answer
    assert [b.type for b in streamed.content] == ["thinking", "text"] and streamed.content[1].text
    assert streamed.usage.output_tokens == MAX_TOKENS
