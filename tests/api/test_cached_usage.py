"""Prompt tokens served from the engine's prefix cache, in each API's own usage fields."""

from __future__ import annotations

from skulk.api.adapters import anthropic, openai_chat, openai_responses
from skulk.shared.types.common import Usage

USAGE = Usage(prompt_tokens=30, completion_tokens=5, total_tokens=35, cached_tokens=24)


def test_openai_reports_cached_prompt_tokens_inside_prompt_tokens() -> None:
    assert openai_chat._usage(USAGE) == {
        "prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35,
        "prompt_tokens_details": {"cached_tokens": 24},
    }
    assert openai_responses._usage(USAGE)["input_tokens_details"] == {"cached_tokens": 24}


def test_anthropic_counts_cache_reads_apart_from_input_tokens() -> None:
    assert anthropic._usage(USAGE, 5) == {
        "input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 24, "output_tokens": 5,
    }
