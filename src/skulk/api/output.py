"""Turns a runner's raw token chunks into what every wire format serialises: reasoning
marked apart from the answer, and tool calls assembled from the finished text.

`OutputShaper.push(chunk)` returns the chunks releasable now; `finish()` the rest, once
the stream has ended normally. For chat requests reasoning becomes `reasoning=True`
chunks, told apart as the model card's reasoning format says (`splitter_for`: a leading
`<think>` block, the card's own tags, or gpt-oss's harmony channels). When the request offers tools (and
`tool_choice` is not "none"), the answer is held until the end and parsed once
(`skulk.api.tool_calls`): a found call leaves as one chunk with `tool_calls` and
finish_reason "tool_calls"; otherwise the held chunks leave unchanged (reasoning is not
held: it can never be a call). Assembling the call once is what lets every format return
a whole, valid call instead of fragile token-by-token fragments. A call of a strict tool
that breaks its schema is not released: `finish` keeps the answer back and sets
`violation`, and the caller generates the call again (`skulk.api.strict_tools`).

Pure and synchronous: no streams, no clocks; tool-call ids come from the caller.
"""

from __future__ import annotations

from collections.abc import Callable

from skulk.api.harmony import HarmonySplitter
from skulk.api.reasoning import ReasoningSplitter
from skulk.api.strict_tools import StrictViolation, strict_violation
from skulk.api.tool_calls import parse_tool_calls
from skulk.shared.types.cards import ReasoningSection
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.common import ToolCall, Usage
from skulk.shared.types.tasks import TextGenerationParams


def wants_tool_parsing(params: TextGenerationParams) -> bool:
    return bool(params.tools) and params.tool_choice != "none"


def splitter_for(reasoning: ReasoningSection | None) -> ReasoningSplitter | HarmonySplitter:
    """The card's reasoning format decides how reasoning is told from the answer: harmony
    channels (gpt-oss), the card's own think tags, or a leading `<think>` block (any model
    may open one; a card that says nothing gets that)."""
    if reasoning is not None and reasoning.format == "harmony":
        return HarmonySplitter()
    if reasoning is not None and reasoning.start_tag and reasoning.end_tag:
        return ReasoningSplitter(reasoning.start_tag, reasoning.end_tag)
    return ReasoningSplitter()


class OutputShaper:
    def __init__(self, params: TextGenerationParams, new_call_id: Callable[[int], str],
                 reasoning: ReasoningSection | None = None, tool_call_format: str | None = None) -> None:
        """`reasoning`: the model card's section (None: no card, the default splitter);
        `tool_call_format`: the card's, whose parser is tried first."""
        self._splitter = splitter_for(reasoning) if params.prompt is None else None
        self._tool_format = tool_call_format
        self._tool_names = frozenset(t.name for t in params.tools) if wants_tool_parsing(params) else frozenset()
        self._tools = params.tools
        self.violation: StrictViolation | None = None
        """Set by `finish` when the answer is a call of a strict tool that breaks its schema."""
        self.answer_usage: Usage | None = None
        """The usage of a held answer that `finish` kept back (see violation)."""
        self._new_call_id = new_call_id
        self._held: list[TokenChunk] = []
        self._last: TokenChunk | None = None

    @property
    def in_reasoning(self) -> bool:
        """True while the output is inside the model's reasoning (a thinking budget counts it)."""
        return self._splitter is not None and self._splitter.in_reasoning

    def push(self, chunk: TokenChunk) -> list[TokenChunk]:
        self._last = chunk
        return self._route(self._split(chunk))

    def finish(self) -> list[TokenChunk]:
        out: list[TokenChunk] = []
        if self._splitter is not None and self._last is not None:
            tail = self._splitter.flush()
            if tail:
                # Held text (an unfinished tag) goes out before the finishing chunk's own.
                out = self._route([self._last.model_copy(update={
                    "text": text, "reasoning": reasoning, "token_id": None, "logprob": None, "top_logprobs": None,
                    "finish_reason": None, "usage": None, "stop_sequence": None, "prompt_tokens": None,
                }) for text, reasoning in tail])
        if not self._tool_names:
            return out
        held, self._held = self._held, []
        text = "".join(c.text for c in held)
        parsed = parse_tool_calls(text, self._tool_names, self._tool_format)
        if not parsed.calls:
            return out + held
        last = self._last
        assert last is not None  # held is non-empty, so a chunk was pushed
        calls = [ToolCall(id=self._new_call_id(i), name=c.name, arguments=c.arguments) for i, c in enumerate(parsed.calls)]
        usage = next((c.usage for c in reversed(held) if c.usage is not None), last.usage)
        self.violation = strict_violation(calls, self._tools)
        if self.violation is not None:
            self.answer_usage = usage
            return out
        prompt_tokens = next((c.prompt_tokens for c in held if c.prompt_tokens is not None), None)
        return [*out, TokenChunk(command_id=last.command_id, text=parsed.content, tool_calls=calls, finish_reason="tool_calls", usage=usage, prompt_tokens=prompt_tokens)]

    def _split(self, chunk: TokenChunk) -> list[TokenChunk]:
        if self._splitter is None or not chunk.text or self._splitter.settled:
            return [chunk]  # the common case once the answer has begun: no work per token
        pieces = self._splitter.push(chunk.text)
        if len(pieces) == 1 and pieces[0] == (chunk.text, chunk.reasoning):
            return [chunk]  # the common case: nothing to change, no copy
        if not pieces:
            # Text held back (a possible tag); keep the chunk for its finish/usage/logprob.
            return [chunk.model_copy(update={"text": ""})]
        # The first piece keeps the token's identity and logprob, the last its ending.
        last = len(pieces) - 1
        return [
            chunk.model_copy(update={
                "text": text,
                "reasoning": reasoning,
                **({} if i == 0 else {"token_id": None, "logprob": None, "top_logprobs": None}),
                **({} if i == last else {"finish_reason": None, "usage": None, "stop_sequence": None}),
            })
            for i, (text, reasoning) in enumerate(pieces)
        ]

    def _route(self, chunks: list[TokenChunk]) -> list[TokenChunk]:
        if not self._tool_names:
            return chunks
        out = []
        for chunk in chunks:
            if chunk.reasoning:
                out.append(chunk)
            else:
                self._held.append(chunk)
        return out


__all__ = ["OutputShaper", "splitter_for", "wants_tool_parsing"]
