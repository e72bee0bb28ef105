"""The legacy OpenAI Completions wire format (`POST /v1/completions`), both ways.

Incoming: `CompletionRequest` and `to_params`, which turns it into a raw-prompt
`TextGenerationParams` (no chat template) or raises `InvalidRequest` naming the parameter.
Outgoing: `CompletionStreamEncoder` (`text_completion` SSE chunks ending in `data: [DONE]`)
and `collect_completion` (one `text_completion` object).

Pure translation only: no streams, commands or cluster here.
"""

# The OpenAI adapters share openai_chat's request helpers (`_in_range`, `_Lenient`, ...):
# one wire family, one set of checks, kept private to the adapters package.
# pyright: reportPrivateUsage=false

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from skulk.api import request_options
from skulk.api.adapters.openai_chat import (
    MAX_CHOICES,
    MIN_TOP_P,
    SSE_DONE,
    _finish_reason,
    _in_range,
    _Lenient,
    _stops,
    _usage,
    choice_count,
    sse_event,
    summed_usage,
)
from skulk.api.errors import InvalidRequest, invalid_request_from_validation
from skulk.shared.types.chunks import PromptTokenLogprob, TokenChunk
from skulk.shared.types.common import Usage
from skulk.shared.types.ids import ModelId
from skulk.shared.types.tasks import TextGenerationParams

DEFAULT_MAX_TOKENS = 16
"""OpenAI's default `max_tokens` for legacy completions."""

COMPLETION_ID_PREFIX = "cmpl-"

MAX_LEGACY_LOGPROBS = 5
"""OpenAI's bound on the legacy `logprobs` (the number of alternatives per token)."""


def legacy_logprobs(chunks: Iterable[TokenChunk], text_offset: int = 0,
                    prompt: Sequence[PromptTokenLogprob] = ()) -> dict[str, Any]:
    """The legacy completions `logprobs` object for the chunks that carry a logprob:
    parallel lists of tokens, their logprobs, their alternatives (token -> logprob) and
    each token's character offset in the completion text; after `prompt`'s scored tokens
    when the request echoed the prompt with logprobs (the first, which nothing precedes,
    has null logprobs, as OpenAI writes it)."""
    tokens: list[str] = []
    logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for entry in prompt:
        tokens.append(entry.token)
        logprobs.append(entry.logprob)
        tops.append({top.token: top.logprob for top in entry.top_logprobs} if entry.logprob is not None else None)
        offsets.append(text_offset)
        text_offset += len(entry.token)
    for chunk in chunks:
        if chunk.logprob is None or chunk.reasoning:
            continue
        tokens.append(chunk.text)
        logprobs.append(chunk.logprob)
        tops.append({top.token: top.logprob for top in chunk.top_logprobs or []})
        offsets.append(text_offset)
        text_offset += len(chunk.text)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


class CompletionRequest(_Lenient):
    model: str
    prompt: str | list[str] | None = None
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int | None = None
    seed: int | None = None
    speculative: bool | None = None
    """Skulk's, as on chat completions (`openai_chat.ChatCompletionRequest.speculative`)."""
    stop: str | list[str] | None = None
    stream: bool | None = False
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None
    user: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None


def prompts(request: CompletionRequest) -> list[str]:
    """The request's prompts (a string, or a list of them: each gets its own choices, in
    order), within MAX_CHOICES generations in all; several are served without `stream`."""
    prompt = request.prompt
    if prompt is None:
        raise InvalidRequest("Missing required parameter: 'prompt'.", param="prompt", code="missing_required_parameter")
    texts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not texts:
        raise InvalidRequest("'prompt' must hold at least one prompt.", param="prompt")
    n = choice_count(request.n)
    if len(texts) * n > MAX_CHOICES:
        raise InvalidRequest(f"{len(texts)} prompts x n={n} is more than {MAX_CHOICES} generations per request.",
                             param="prompt")
    return texts


def to_params(request: CompletionRequest, prompt: str | None = None) -> TextGenerationParams:
    """The internal raw-prompt generation request (for `prompt`, one of `prompts(request)`;
    by default the first), or `InvalidRequest` naming the parameter."""
    if not request.model.strip():
        raise InvalidRequest("'model' must name a model.", param="model")
    prompt = prompts(request)[0] if prompt is None else prompt
    if request.best_of is not None and request.best_of != 1:
        raise InvalidRequest(f"Only best_of=1 is supported, got best_of={request.best_of}.", param="best_of")
    if request.suffix:
        raise InvalidRequest("'suffix' (fill in the middle) needs an infill prompt format, which Skulk does not "
                             "serve; send the text before the gap as 'prompt' alone.", param="suffix",
                             code="unsupported_parameter")
    if request.logprobs is not None and not (0 <= request.logprobs <= MAX_LEGACY_LOGPROBS):
        raise InvalidRequest(f"'logprobs' must be between 0 and {MAX_LEGACY_LOGPROBS}, got {request.logprobs}.",
                             param="logprobs")
    if request.max_tokens is not None and request.max_tokens < 1:
        raise InvalidRequest(f"'max_tokens' must be at least 1, got {request.max_tokens}.", param="max_tokens")
    if request.top_k is not None and request.top_k < 0:
        raise InvalidRequest(f"'top_k' must be at least 0, got {request.top_k}.", param="top_k")
    temperature = _in_range(request.temperature, 0.0, 2.0, "temperature")
    top_p = _in_range(request.top_p, 0.0, 1.0, "top_p")
    try:
        return TextGenerationParams(
            model_id=ModelId(request.model),
            prompt=prompt,
            max_tokens=request.max_tokens,
            temperature=temperature,
            top_p=None if top_p is None else max(top_p, MIN_TOP_P),
            top_k=request.top_k,
            seed=request.seed,
            speculative=request.speculative,
            stop=_stops(request.stop),
            logprobs=request.logprobs is not None,
            top_logprobs=request.logprobs,
            # Echoed with logprobs: the prompt's tokens are scored too (an engine that
            # cannot is refused by the traits table, naming 'echo').
            prompt_logprobs=bool(request.echo) and request.logprobs is not None,
            stream=bool(request.stream),
            frequency_penalty=request_options.penalty(request.frequency_penalty, "frequency_penalty"),
            presence_penalty=request_options.penalty(request.presence_penalty, "presence_penalty"),
            repeat_penalty=request_options.repeat_penalty(request.repetition_penalty, "repetition_penalty"),
            logit_bias=request_options.logit_bias(request.logit_bias),
        )
    except ValidationError as error:
        raise invalid_request_from_validation(error) from None


def completion_id(command_id: str) -> str:
    return f"{COMPLETION_ID_PREFIX}{command_id}"


def _body(command_id: str, model: str, created: int, text: str, finish_reason: str | None,
          index: int = 0) -> dict[str, Any]:
    return {
        "id": completion_id(command_id),
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"text": text, "index": index, "logprobs": None, "finish_reason": finish_reason}],
    }


@dataclass
class CompletionStreamEncoder:
    """`text_completion` SSE chunks: one per token chunk with text, then a final chunk with
    the finish_reason and usage, then `[DONE]`."""

    command_id: str
    model: str
    created: int
    logprobs: bool = False
    echo: str | None = None
    """The prompt, sent first when the request asked for `echo`."""
    index: int = 0
    """The choice this encoder's chunks belong to (several prompts, or n > 1)."""
    one_of_several: bool = False
    """One of several interleaved choices: its final chunk carries the finish_reason only;
    `closing` sends the summed usage and `[DONE]` once every choice has finished."""
    prompts: int = 1
    """How many prompts the choices answer (their usage counts each prompt once)."""
    _finish_reason: str | None = field(default=None, init=False)
    _usage: Usage | None = field(default=None, init=False)
    _count: int = field(default=0, init=False)
    _offset: int = field(default=0, init=False)

    def start(self) -> list[str]:
        if not self.echo or self.logprobs:
            return []  # echoed with logprobs: sent with the first chunk, which carries the prompt's
        return [self._echo_event()]

    def _echo_event(self, prompt: Sequence[PromptTokenLogprob] = ()) -> str:
        assert self.echo is not None
        body = _body(self.command_id, self.model, self.created, self.echo, None, self.index)
        if self.logprobs:
            body["choices"][0]["logprobs"] = legacy_logprobs([], 0, prompt)
        self._offset = len(self.echo)
        return sse_event(body)

    def chunk_to_sse(self, chunk: TokenChunk) -> list[str]:
        echo_now = self.echo and self.logprobs and self._count == 0
        events = [self._echo_event(chunk.prompt_logprobs or ())] if echo_now else []
        return events + self._token_events(chunk)

    def _token_events(self, chunk: TokenChunk) -> list[str]:
        self._count += 1
        self._finish_reason = chunk.finish_reason or self._finish_reason
        self._usage = chunk.usage or self._usage
        if not chunk.text or chunk.reasoning:
            return []
        body = _body(self.command_id, self.model, self.created, chunk.text, None, self.index)
        if self.logprobs:
            body["choices"][0]["logprobs"] = legacy_logprobs([chunk], self._offset)
        self._offset += len(chunk.text)
        return [sse_event(body)]

    @property
    def usage(self) -> Usage:
        return self._usage or Usage(completion_tokens=self._count, total_tokens=self._count)

    def finish(self) -> list[str]:
        early = [self._echo_event()] if self.echo and self.logprobs and self._count == 0 else []
        body = _body(self.command_id, self.model, self.created, "", _finish_reason(self._finish_reason, False),
                     self.index)
        if self.one_of_several:
            return [*early, sse_event(body)]
        body["usage"] = _usage(self.usage)
        return [*early, sse_event(body), SSE_DONE]

    def closing(self, encoders: Sequence[CompletionStreamEncoder]) -> list[str]:
        """After every one of several choices finished: a `choices: []` chunk with their
        summed usage, and `[DONE]`."""
        body = _body(self.command_id, self.model, self.created, "", None)
        body["choices"] = []
        body["usage"] = _usage(summed_usage([e.usage for e in encoders], self.prompts))
        return [sse_event(body), SSE_DONE]


def collect_completion(
    chunks: Iterable[TokenChunk], *, command_id: str, model: str, created: int, logprobs: bool = False,
    echo: str | None = None,
) -> dict[str, Any]:
    """The non-streaming `text_completion` for a completed stream's chunks (after `echo`,
    the prompt, when the request asked for it)."""
    chunks = list(chunks)
    texts: list[str] = []
    finish_reason: str | None = None
    usage: Usage | None = None
    count = 0
    for chunk in chunks:
        count += 1
        if not chunk.reasoning:
            texts.append(chunk.text)
        finish_reason = chunk.finish_reason or finish_reason
        usage = chunk.usage or usage
    body = _body(command_id, model, created, (echo or "") + "".join(texts), _finish_reason(finish_reason, False))
    if logprobs:
        prompt = (chunks[0].prompt_logprobs or []) if echo is not None and chunks else []
        body["choices"][0]["logprobs"] = legacy_logprobs(chunks, len(echo or "") if not prompt else 0, prompt)
    body["usage"] = _usage(usage or Usage(completion_tokens=count, total_tokens=count))
    return body


__all__ = [
    "COMPLETION_ID_PREFIX",
    "DEFAULT_MAX_TOKENS",
    "MAX_LEGACY_LOGPROBS",
    "CompletionRequest",
    "CompletionStreamEncoder",
    "collect_completion",
    "completion_id",
    "legacy_logprobs",
    "prompts",
    "to_params",
]
