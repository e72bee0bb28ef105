"""Anthropic's `thinking.budget_tokens` as a hard cap (`skulk.api.thinking_budget`): the pure
pieces table-tested, and the whole exchange through the official SDK against a scripted
cluster, where a model that would think past its budget is cut at it and answers in a
continuation. tests/e2e/test_thinking_budget.py runs the same on a real node and engine."""

from __future__ import annotations

import pytest

from skulk.api.thinking_budget import (
    HARMONY_CLOSE,
    BudgetMeter,
    closing_text,
    continuation_params,
    continued_usage,
)
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.cards import ReasoningSection
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.commands import CancelCommand, GenerateText
from skulk.shared.types.common import ChatMessage, Usage
from skulk.shared.types.tasks import TextGenerationParams
from tests.api.scripted_cluster import USAGE, scripted_app
from tests.api.test_openai_routes import MODEL
from tests.api.test_tools_sdk import anthropic_sdk

THINK = ReasoningSection(format="think_tags", start_tag="<think>", end_tag="</think>", switches=("enable_thinking",))
HARMONY = ReasoningSection(format="harmony", switches=("reasoning_effort",))


@pytest.mark.parametrize(("section", "thought", "close"), [
    (THINK, "hmm", "\n</think>\n\n"),
    (THINK, "hmm\n", "</think>\n\n"),
    (ReasoningSection(format="think_tags", start_tag="<r>", end_tag="</r>"), "x", "\n</r>\n\n"),
    (None, "x", "\n</think>\n\n"),
    (HARMONY, "<|channel|>analysis<|message|>x", HARMONY_CLOSE),
])
def test_the_closing_marker_is_the_cards(section, thought, close):
    assert closing_text(section, thought) == close


def chunk(text: str, **fields) -> TokenChunk:
    return TokenChunk(command_id="c", text=text, **fields)


@pytest.mark.parametrize(("steps", "cut_at"), [
    # in_reasoning after each chunk, budget 3 -> the index of the chunk that cuts, or None
    ([True, True, True], 2),
    ([False, True, True, True], 3),  # answer text before the reasoning is not counted
    ([True, True, False, False], None),  # the reasoning closed in time
])
def test_the_meter_cuts_only_open_reasoning_at_the_budget(steps, cut_at):
    meter = BudgetMeter(budget=3)
    cuts = [meter.spent(chunk(str(i)), reasoning) for i, reasoning in enumerate(steps)]
    assert cuts == [i == cut_at for i in range(len(steps))]
    assert meter.cut is (cut_at is not None)
    # Reasoning that closed in time: nothing more is kept (the answer may be long).
    assert meter.closed is (cut_at is None) and (not meter.closed or meter.raw == [])


def test_a_finishing_chunk_never_cuts():
    meter = BudgetMeter(budget=1)
    assert meter.spent(chunk("a", finish_reason="length"), True) is False and not meter.cut


def test_the_continuation_carries_the_thought_and_the_tokens_left():
    params = TextGenerationParams(model_id=MODEL, messages=[ChatMessage(role="user", content="?")], max_tokens=10,
                                  thinking=True, thinking_budget=4)
    meter = BudgetMeter(budget=4)
    for i, text in enumerate(["<think>", "a", "b", "c"]):
        meter.spent(chunk(text, prompt_tokens=7 if i == 0 else None), True)
    more = continuation_params(params, meter, "\n</think>\n\n")
    assert (more.continue_from, more.max_tokens, more.thinking_budget, more.thinking) == (
        "<think>abc\n</think>\n\n", 6, None, True)
    assert continued_usage(meter, Usage(prompt_tokens=20, completion_tokens=5, total_tokens=25, cached_tokens=18)) == \
        Usage(prompt_tokens=7, completion_tokens=9, total_tokens=16, cached_tokens=7)
    assert more.redacted().continue_from == ""


def test_a_raw_prompt_cannot_be_continued_as_a_chat_turn():
    with pytest.raises(ValueError, match="continue_from"):
        TextGenerationParams(model_id=MODEL, prompt="x", continue_from="y")


BUDGET = 1024
MAX_TOKENS = 1500


def budget_app(reasoning: ReasoningSection, first: list[str], answer: list[str]):
    """A model that thinks `first` (never closing its reasoning) and, continued, answers."""
    card = load_card(builtin_cards_dir() / "local--tiny-llama.toml")
    card = card.model_copy(update={"reasoning": reasoning, "capabilities": (*card.capabilities, "thinking")})
    return scripted_app(lambda params: answer if params.continue_from else first,
                        context_fields={"get_cards": lambda: {MODEL: card}}, finish="length")


def thinking(**fields):
    return {"model": MODEL, "max_tokens": MAX_TOKENS, "messages": [{"role": "user", "content": "?"}],
            "thinking": {"type": "enabled", "budget_tokens": BUDGET}, **fields}


async def test_reasoning_is_cut_at_the_budget_and_the_model_answers():
    first = ["<think>", *["x"] * 2000]
    app, cluster = budget_app(THINK, first, ["Paris", "."])
    reply = await anthropic_sdk(app).messages.create(**thinking())
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in reply.content] == [
        ("thinking", "x" * (BUDGET - 1)), ("text", "Paris.")]
    # The prompt once, the output of both runs: the budget's tokens and the answer's.
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (USAGE.prompt_tokens, BUDGET + USAGE.completion_tokens)
    runs = cluster.all_params()
    assert len(runs) == 2 and runs[0].thinking_budget == BUDGET
    assert runs[1].continue_from == "<think>" + "x" * (BUDGET - 1) + "\n</think>\n\n"
    assert (runs[1].max_tokens, runs[1].thinking_budget, runs[1].thinking) == (MAX_TOKENS - BUDGET, None, True)
    # The first run was stopped at the budget, not left running.
    first_id = next(c.command_id for c in cluster.commands if isinstance(c, GenerateText))
    assert any(isinstance(c, CancelCommand) and c.cancelled_command_id == first_id for c in cluster.commands)


async def test_streamed_the_thinking_stops_at_the_budget_then_the_text_follows():
    app, _ = budget_app(THINK, ["<think>", *["x"] * 2000], ["Paris", "."])
    async with anthropic_sdk(app).messages.stream(**thinking()) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()
    deltas = [(e.delta.type, getattr(e.delta, "thinking", None) or getattr(e.delta, "text", None))
              for e in events if e.type == "content_block_delta"]
    assert "".join(t for kind, t in deltas if kind == "thinking_delta") == "x" * (BUDGET - 1)
    assert "".join(t for kind, t in deltas if kind == "text_delta") == "Paris."
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.usage.output_tokens == BUDGET + USAGE.completion_tokens


async def test_harmony_reasoning_is_closed_into_the_final_channel():
    first = ["<|channel|>", "analysis", "<|message|>", *["y"] * 2000]
    app, cluster = budget_app(HARMONY, first, ["Paris", "."])
    reply = await anthropic_sdk(app).messages.create(**thinking())
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in reply.content] == [
        ("thinking", "y" * (BUDGET - 1)), ("text", "Paris.")]
    assert cluster.all_params()[1].continue_from.endswith("y" + HARMONY_CLOSE)


async def test_reasoning_that_ends_within_the_budget_runs_once():
    app, cluster = budget_app(THINK, ["<think>", "short", "</think>", "Paris", "."], ["never"])
    reply = await anthropic_sdk(app).messages.create(**thinking())
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in reply.content] == [
        ("thinking", "short"), ("text", "Paris.")]
    assert len(cluster.all_params()) == 1
