"""A thinking budget held as a hard cap: reasoning still open when it has taken the budget's
tokens is closed there, and the model answers in a continuation of the same turn.

Anthropic's `thinking.budget_tokens` caps the reasoning, not the whole output. No engine
here can end a reasoning block by itself, so the API does it the way a person would: it
counts the reasoning tokens as they stream (`BudgetMeter`), and at the budget it stops the
generation, writes the card's closing marker after what the model thought (`closing_text`),
and starts a continuation whose prompt is the same conversation with that text opening the
assistant turn (`continuation_params`; every engine honours `continue_from`, and the
prefix caches find the first run's KV). The client sees one answer: the reasoning up to the
budget, then the answer; usage counts the prompt once and both runs' output tokens
(`continued_usage`).

Pure and synchronous: `skulk.api.generation.drive` moves the chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from skulk.api.reasoning import CLOSE_TAG
from skulk.shared.types.cards import ReasoningSection
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.common import Usage
from skulk.shared.types.tasks import TextGenerationParams

HARMONY_CLOSE = "<|end|><|start|>assistant<|channel|>final<|message|>"
"""Ends gpt-oss's analysis message and opens its final answer."""


def closing_text(reasoning: ReasoningSection | None, thought: str) -> str:
    """What ends a reasoning block cut short after `thought` (the raw output so far), in the
    model's own format: the harmony final channel, or the card's end tag (`</think>` when the
    card names none) on its own line followed by the blank line the models' templates put
    before the answer."""
    if reasoning is not None and reasoning.format == "harmony":
        return HARMONY_CLOSE
    end = reasoning.end_tag if reasoning is not None and reasoning.end_tag else CLOSE_TAG
    return ("" if thought.endswith("\n") else "\n") + end + "\n\n"


@dataclass
class BudgetMeter:
    """Counts one generation's reasoning tokens against its budget. `spent` is told of each
    raw chunk (one sampled token) after the shaper saw it, with whether the reasoning is
    still open; it answers True once the budget is taken and the reasoning is still open
    (the caller then stops the run). A chunk that ends the run never triggers a cut."""

    budget: int
    tokens: int = 0
    """Output tokens of the run so far (reasoning and any answer text before it)."""
    reasoning_tokens: int = 0
    prompt_tokens: int | None = None
    """The prompt's length as the run's first chunk said it."""
    raw: list[str] = field(default_factory=list)
    cut: bool = False
    closed: bool = False
    """The reasoning ended within the budget: nothing is counted or kept from here on."""

    def spent(self, chunk: TokenChunk, in_reasoning: bool) -> bool:
        if self.closed:
            return False
        self.tokens += 1
        self.raw.append(chunk.text)
        if chunk.prompt_tokens is not None and self.prompt_tokens is None:
            self.prompt_tokens = chunk.prompt_tokens
        if in_reasoning:
            self.reasoning_tokens += 1
        elif self.reasoning_tokens:
            self.closed, self.raw = True, []
        if chunk.finish_reason is not None or not in_reasoning or self.reasoning_tokens < self.budget:
            return False
        self.cut = True
        return True

    @property
    def thought(self) -> str:
        """The run's raw output up to the cut."""
        return "".join(self.raw)


def continuation_params(params: TextGenerationParams, meter: BudgetMeter, close: str) -> TextGenerationParams:
    """The request that continues a run cut at its budget: the same conversation, its
    assistant turn opening with what the model thought and the closing marker, for the
    output tokens left (max_tokens counts reasoning and answer together), with no budget of
    its own."""
    left = None if params.max_tokens is None else max(1, params.max_tokens - meter.tokens)
    return params.model_copy(update={"continue_from": meter.thought + close, "max_tokens": left,
                                     "thinking_budget": None})


def continued_usage(meter: BudgetMeter, usage: Usage | None) -> Usage | None:
    """The usage of an answer given in two runs: the prompt once (the continuation's prompt
    also holds the first run's output), the output tokens of both."""
    if usage is None:
        return None
    prompt = meter.prompt_tokens if meter.prompt_tokens is not None else max(0, usage.prompt_tokens - meter.tokens)
    completion = meter.tokens + usage.completion_tokens
    return usage.model_copy(update={"prompt_tokens": prompt, "completion_tokens": completion,
                                    "total_tokens": prompt + completion,
                                    "cached_tokens": min(usage.cached_tokens, prompt)})


__all__ = ["HARMONY_CLOSE", "BudgetMeter", "closing_text", "continuation_params", "continued_usage"]
