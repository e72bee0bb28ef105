"""The observer's summary is built from the chunks Skulk delivered, reasoning apart."""

from __future__ import annotations

import dataclasses

import pytest

from skulk.extensions.summary import summarise
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.common import ToolCall, Usage
from skulk.shared.types.ids import CommandId

C = CommandId("c1")


def test_text_thinking_finish_usage_and_tools() -> None:
    chunks = [
        TokenChunk(command_id=C, text="hmm", reasoning=True, prompt_tokens=7),
        TokenChunk(command_id=C, text="Hel"),
        TokenChunk(command_id=C, text="lo", tool_calls=[ToolCall(id="1", name="lookup", arguments="{}")]),
        TokenChunk(
            command_id=C,
            text="",
            finish_reason="stop",
            usage=Usage(prompt_tokens=9, completion_tokens=3, total_tokens=12),
        ),
    ]
    summary = summarise(chunks, request_id="r", model_id="m", wire="openai.chat")
    assert (summary.text, summary.thinking, summary.finish_reason) == ("Hello", "hmm", "stop")
    assert (summary.prompt_tokens, summary.completion_tokens, summary.tool_calls) == (9, 3, ("lookup",))
    assert summary.error is None


def test_an_empty_response_and_its_error() -> None:
    summary = summarise([], request_id="r", model_id="m", wire="ollama.chat", choice_index=2, error="client left")
    assert (summary.text, summary.finish_reason, summary.prompt_tokens, summary.choice_index) == ("", None, None, 2)
    assert summary.error == "client left"


def test_the_summary_is_frozen() -> None:
    summary = summarise([], request_id="r", model_id="m", wire="openai.chat")
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.text = "changed"  # type: ignore[misc]
