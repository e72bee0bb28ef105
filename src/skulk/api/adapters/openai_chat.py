"""The OpenAI Chat Completions wire format, both ways.

Incoming: `ChatCompletionRequest` (what OpenAI clients send; unknown fields are ignored, as
OpenAI does) and `to_params`, which normalises it into the internal `TextGenerationParams`
or raises `InvalidRequest` naming the parameter to fix. Outgoing: `ChatStreamEncoder` turns
token chunks into `chat.completion.chunk` SSE events ending in `data: [DONE]`,
`collect_response` builds a non-streaming `chat.completion`, and `model_list` answers
`GET /v1/models`.

A `tool_choice` that forces a call ("required", or a named function) is decoded under a
grammar on the engine; a forced tool whose schema no grammar can enforce is refused here
with a 400 naming `tools[i].function.parameters` (`skulk.api.tool_calls.check_enforceable`).

Images: `image_url` parts in user messages (a `data:` URL, or an http(s) URL the route has
fetched, `image_urls`) become the message's checked images (`skulk.api.media`), each marked
in the text where its part stood; `detail` other than "auto" is refused by name.

Pure translation only: this module must never touch streams, commands or the cluster, and
never decide policy beyond what the OpenAI format itself requires.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from skulk.api import media, request_options
from skulk.api.errors import ApiError, InvalidRequest, invalid_request_from_validation, openai_error_body
from skulk.api.strict_tools import check_strict_schemas
from skulk.api.tool_calls import check_enforceable
from skulk.shared.json_shapes import is_json_object
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.common import ChatMessage, ChatRole, ToolCall, ToolSpec, Usage
from skulk.shared.types.ids import ModelId
from skulk.shared.types.instances import Instance, InstanceCapacity
from skulk.shared.types.media import IMAGE_MARKER, ImageInput
from skulk.shared.types.tasks import TextGenerationParams

MAX_CHOICES = 8
"""The most choices (`n`) one request may ask for. Each is a whole generation queued on the
instance, so a bound keeps one request from filling a runner's queue (OpenAI allows 128)."""

MAX_STOP_SEQUENCES = 4
"""OpenAI accepts at most four stop sequences."""

MAX_TOP_LOGPROBS = 20
"""OpenAI's upper bound on `top_logprobs`."""

MIN_TOP_P = 1e-6
"""OpenAI allows `top_p: 0` (keep only the most likely token); the internal params need a
positive nucleus, and any nucleus this small keeps exactly that one token."""

COMPLETION_ID_PREFIX = "chatcmpl-"
"""Completion ids are this prefix plus the command id, so `POST /v1/cancel/{id}` takes either."""

TOOL_CHOICE_WORDS = frozenset({"none", "auto", "required"})

_ROLES: dict[str, ChatRole] = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
"""OpenAI roles -> internal roles. `developer` is the newer name for `system`."""

# ---------------------------------------------------------------------------------------
# Request
# ---------------------------------------------------------------------------------------


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ImageUrl(_Lenient):
    url: str
    detail: str | None = None


class ContentPart(_Lenient):
    """One part of a list-valued `content`: `text` or `image_url` (an https or `data:` URL,
    `skulk.api.media`). Other types are accepted by the schema so that `to_params` can name
    them in a clear 400."""

    type: str
    text: str | None = None
    image_url: ImageUrl | str | None = None


class FunctionCall(_Lenient):
    name: str
    arguments: str = ""


class MessageToolCall(_Lenient):
    id: str
    type: str = "function"
    function: FunctionCall


class Message(_Lenient):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    """An assistant turn's reasoning sent back (the extension Skulk and llama-server answer with)."""


class FunctionDefinition(_Lenient):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Lenient):
    type: str = "function"
    function: FunctionDefinition


class StreamOptions(_Lenient):
    include_usage: bool | None = None


class ChatCompletionRequest(_Lenient):
    """`POST /v1/chat/completions`, as OpenAI documents it. Range and combination rules live
    in `to_params`, so that each failure names its parameter the OpenAI way."""

    model: str
    messages: list[Message]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    """Not OpenAI's; accepted as the common extension that llama.cpp and vLLM servers take."""
    min_p: float | None = None
    """Not OpenAI's either; the same extension (llama-server, vLLM and Ollama's /v1 take it)."""
    speculative: bool | None = None
    """Skulk's: whether the request is drafted; refused unless it is how the model is served
    (`skulk.shared.types.speculative.request_refusal`)."""
    reasoning_effort: str | None = None
    """A level for a template that takes one; 'none'/'minimal' turn reasoning off."""
    n: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    """Structured output (`json_object`, `json_schema`), enforced by constrained decoding."""
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    """Not OpenAI's: the multiplicative penalty vLLM and llama.cpp servers accept."""
    logit_bias: dict[str, float] | None = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    web_search_options: Any = None
    functions: Any = None
    function_call: Any = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


def parse_request(body: Any) -> ChatCompletionRequest:
    """A decoded JSON body as a request; schema violations raise `InvalidRequest`."""
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as error:
        raise invalid_request_from_validation(error) from None


def _image_url(part: ContentPart) -> ImageUrl | None:
    return ImageUrl(url=part.image_url) if isinstance(part.image_url, str) else part.image_url


def image_urls(request: ChatCompletionRequest) -> list[tuple[str, str]]:
    """The http(s) image URLs of a request, each with the field naming it: the route fetches
    them (`skulk.api.image_fetch`) before `to_params`."""
    urls: list[tuple[str, str]] = []
    for index, message in enumerate(request.messages):
        for part_index, part in enumerate(message.content if isinstance(message.content, list) else []):
            image = _image_url(part) if part.type == "image_url" else None
            if image is not None and media.is_fetched_url(image.url):
                urls.append((image.url, f"messages[{index}].content[{part_index}].image_url.url"))
    return urls


def _message_text(content: str | list[ContentPart] | None, where: str,
                  fetched: Mapping[str, bytes]) -> tuple[str | None, list[ImageInput]]:
    if content is None or isinstance(content, str):
        return media.check_text(content, f"{where}.content"), []
    texts: list[str] = []
    images: list[ImageInput] = []
    for index, part in enumerate(content):
        at = f"{where}.content[{index}]"
        if part.type == "image_url":
            image = _image_url(part)
            if image is None:
                raise InvalidRequest("An image_url content part needs 'image_url.url'.", param=f"{at}.image_url")
            detail = media.check_detail(image.detail, f"{at}.image_url.detail")
            images.append(media.image_from_url(image.url, fetched, f"{at}.image_url.url", detail))
            texts.append(IMAGE_MARKER)
            continue
        if part.type != "text":
            raise InvalidRequest(
                f"Content parts of type {part.type!r} are not supported; only 'text' and 'image_url' parts are.",
                param=f"{at}.type",
            )
        if part.text is None:
            raise InvalidRequest("A text content part needs 'text'.", param=f"{at}.text")
        texts.append(media.check_text(part.text, f"{at}.text") or "")
    # Separate parts are separate passages; a newline keeps their words apart.
    return "\n".join(texts), images


def _to_message(message: Message, index: int, fetched: Mapping[str, bytes]) -> ChatMessage:
    where = f"messages[{index}]"
    role = _ROLES.get(message.role)
    if role is None:
        raise InvalidRequest(
            f"Invalid role {message.role!r}; expected one of {', '.join(sorted(_ROLES))}.", param=f"{where}.role"
        )
    content, images = _message_text(message.content, where, fetched)
    if images and role != "user":
        raise InvalidRequest("Only user messages may carry images.", param=f"{where}.content")
    tool_calls: list[ToolCall] = []
    for call_index, call in enumerate(message.tool_calls or []):
        if role != "assistant":
            raise InvalidRequest("Only assistant messages may carry tool_calls.", param=f"{where}.tool_calls")
        if call.type != "function":
            raise InvalidRequest(
                f"Tool calls of type {call.type!r} are not supported; only 'function' is.",
                param=f"{where}.tool_calls[{call_index}].type",
            )
        tool_calls.append(ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments))
    if role == "tool" and not message.tool_call_id:
        raise InvalidRequest("A tool message needs the 'tool_call_id' it answers.", param=f"{where}.tool_call_id")
    if content is None and not tool_calls:
        raise InvalidRequest("A message needs 'content' (or, for an assistant, 'tool_calls').", param=f"{where}.content")
    return ChatMessage(role=role, content=content, name=message.name, tool_calls=tool_calls,
                       tool_call_id=message.tool_call_id,
                       reasoning_content=message.reasoning_content if role == "assistant" else None,
                       images=images)


def _to_tools(request: ChatCompletionRequest) -> list[ToolSpec]:
    tools: list[ToolSpec] = []
    for index, tool in enumerate(request.tools or []):
        if tool.type != "function":
            raise InvalidRequest(
                f"Tools of type {tool.type!r} are not supported; only 'function' is.", param=f"tools[{index}].type"
            )
        tools.append(ToolSpec(
            name=tool.function.name, description=tool.function.description or "",
            parameters=tool.function.parameters or {}, strict=bool(tool.function.strict),
        ))
    return tools


def _check_tool_choice(choice: str | dict[str, Any] | None, tools: Sequence[ToolSpec]) -> None:
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in TOOL_CHOICE_WORDS:
            raise InvalidRequest(
                f"Invalid tool_choice {choice!r}; expected 'none', 'auto', 'required' or a function.", param="tool_choice"
            )
        if choice == "required" and not tools:
            raise InvalidRequest("tool_choice 'required' needs 'tools'.", param="tool_choice")
        return
    function = choice.get("function")
    name = function.get("name") if is_json_object(function) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise InvalidRequest(
            'A tool_choice object must be {"type": "function", "function": {"name": ...}}.', param="tool_choice"
        )
    if name not in {t.name for t in tools}:
        raise InvalidRequest(f"tool_choice names {name!r}, which is not among 'tools'.", param="tool_choice")


def choice_count(n: int | None) -> int:
    """How many choices (`n`) a request asks for, within 1..MAX_CHOICES. Streamed, the
    choices' chunks interleave, each carrying its `index` (`skulk.api.generation.
    encoded_choice_events`)."""
    count = 1 if n is None else n
    if not 1 <= count <= MAX_CHOICES:
        raise InvalidRequest(f"'n' must be between 1 and {MAX_CHOICES}, got {n}.", param="n")
    return count


def summed_usage(usages: Sequence[Usage], prompts: int = 1) -> Usage:
    """The usage of several choices of one request (`prompts` groups of equal size, one per
    prompt): each prompt counted once, completions summed, as `merge_choices` counts."""
    per_prompt = max(1, len(usages) // prompts)
    prompt = sum(u.prompt_tokens for u in usages[::per_prompt])
    completion = sum(u.completion_tokens for u in usages)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def merge_choices(bodies: Sequence[dict[str, Any]], prompts: int = 1) -> dict[str, Any]:
    """One response holding the single choice of each of `bodies` (collected completions
    of one request, `prompts` groups of equal size, one per prompt), indexed in order; each
    prompt counted once, completions summed."""
    merged = dict(bodies[0])
    merged["choices"] = [{**body["choices"][0], "index": index} for index, body in enumerate(bodies)]
    per_prompt = len(bodies) // prompts
    prompt = sum(body["usage"]["prompt_tokens"] for body in bodies[::per_prompt])
    completion = sum(body["usage"]["completion_tokens"] for body in bodies)
    cached = sum(body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) for body in bodies[::per_prompt])
    merged["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                       "prompt_tokens_details": {"cached_tokens": cached}}
    return merged


def _max_tokens(request: ChatCompletionRequest) -> int | None:
    for param in ("max_completion_tokens", "max_tokens"):
        value = getattr(request, param)
        if value is not None:
            if value < 1:
                raise InvalidRequest(f"'{param}' must be at least 1, got {value}.", param=param)
            return value
    return None


def _in_range(value: float | None, low: float, high: float, param: str) -> float | None:
    # Written as a positive range test so that NaN (which Python's JSON accepts) fails too.
    if value is not None and not (low <= value <= high):
        raise InvalidRequest(f"'{param}' must be between {low:g} and {high:g}, got {value}.", param=param)
    return value


def _stops(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(f"At most {MAX_STOP_SEQUENCES} stop sequences are allowed, got {len(stops)}.", param="stop")
    if any(s == "" for s in stops):
        raise InvalidRequest("Stop sequences must not be empty.", param="stop")
    return stops


UNSERVED_FIELDS = {
    "audio": "audio output is not served",
    "prediction": "predicted outputs are not served",
    "web_search_options": "Skulk runs no web search",
    "functions": "the legacy 'functions' is not served; send 'tools'",
    "function_call": "the legacy 'function_call' is not served; send 'tool_choice'",
}
"""OpenAI fields that would change the answer, which Skulk cannot honour: refused when set."""


def _refuse_unserved(request: ChatCompletionRequest) -> None:
    for name, why in UNSERVED_FIELDS.items():
        if getattr(request, name) is not None:
            raise InvalidRequest(f"'{name}' is not supported: {why}.", param=name, code="unsupported_parameter")
    if request.modalities is not None and set(request.modalities) - {"text"}:
        raise InvalidRequest(f"Only text output is served, got modalities {request.modalities}.",
                             param="modalities", code="unsupported_parameter")


def to_params(request: ChatCompletionRequest, fetched: Mapping[str, bytes] | None = None) -> TextGenerationParams:
    """The internal generation request, or `InvalidRequest` naming the parameter at fault.
    `fetched`: the bodies of the request's http(s) image URLs (`image_urls`), as the route
    fetched them."""
    _refuse_unserved(request)
    if not request.model.strip():
        raise InvalidRequest("'model' must name a model.", param="model")
    if not request.messages:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages")
    choice_count(request.n)
    temperature = _in_range(request.temperature, 0.0, 2.0, "temperature")
    top_p = _in_range(request.top_p, 0.0, 1.0, "top_p")
    if request.top_k is not None and request.top_k < 0:
        raise InvalidRequest(f"'top_k' must be at least 0, got {request.top_k}.", param="top_k")
    min_p = _in_range(request.min_p, 0.0, 1.0, "min_p")
    if request.top_logprobs is not None:
        _in_range(request.top_logprobs, 0, MAX_TOP_LOGPROBS, "top_logprobs")
        if not request.logprobs:
            raise InvalidRequest("'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
    messages = [_to_message(m, i, fetched or {}) for i, m in enumerate(request.messages)]
    tools = _to_tools(request)
    _check_tool_choice(request.tool_choice, tools)
    check_enforceable(tools, request.tool_choice, lambda index: f"tools[{index}].function.parameters")
    check_strict_schemas(tools, lambda index: f"tools[{index}].function.parameters")
    try:
        return TextGenerationParams(
            model_id=ModelId(request.model),
            messages=messages,
            max_tokens=_max_tokens(request),
            temperature=temperature,
            top_p=None if top_p is None else max(top_p, MIN_TOP_P),
            top_k=request.top_k,
            min_p=min_p,
            speculative=request.speculative,
            **request_options.reasoning_choice(request.reasoning_effort, "reasoning_effort"),
            seed=request.seed,
            stop=_stops(request.stop),
            tools=tools,
            tool_choice=request.tool_choice,
            logprobs=bool(request.logprobs),
            top_logprobs=request.top_logprobs,
            stream=bool(request.stream),
            response_format=request_options.openai_response_format(request.response_format),
            frequency_penalty=request_options.penalty(request.frequency_penalty, "frequency_penalty"),
            presence_penalty=request_options.penalty(request.presence_penalty, "presence_penalty"),
            repeat_penalty=request_options.repeat_penalty(request.repetition_penalty, "repetition_penalty"),
            logit_bias=request_options.logit_bias(request.logit_bias),
        )
    except ValidationError as error:
        raise invalid_request_from_validation(error) from None


# ---------------------------------------------------------------------------------------
# Response pieces
# ---------------------------------------------------------------------------------------

_OPENAI_FINISH_REASONS = frozenset({"stop", "length", "tool_calls"})


def completion_id(command_id: str) -> str:
    return f"{COMPLETION_ID_PREFIX}{command_id}"


def command_id_from(value: str) -> str:
    """A command id from either itself or a completion id."""
    return value.removeprefix(COMPLETION_ID_PREFIX)


def _usage(usage: Usage) -> dict[str, Any]:
    """OpenAI's usage; prompt tokens served from the engine's prefix cache are
    `prompt_tokens_details.cached_tokens` (still counted in `prompt_tokens`, as OpenAI does).
    A speculating engine's drafted tokens are OpenAI's predicted-output counts: the accepted
    ones `completion_tokens_details.accepted_prediction_tokens`, the rest rejected."""
    body: dict[str, Any] = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                            "total_tokens": usage.total_tokens,
                            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}
    if usage.drafted_tokens:
        body["completion_tokens_details"] = {
            "accepted_prediction_tokens": usage.accepted_draft_tokens,
            "rejected_prediction_tokens": usage.drafted_tokens - usage.accepted_draft_tokens,
        }
    return body


def _finish_reason(reported: str | None, saw_tool_calls: bool) -> str:
    # Internal reasons the OpenAI format lacks ('error', 'cancelled') never end a completed
    # stream in practice (those streams fail); should one appear, the text did stop.
    reason = reported if reported in _OPENAI_FINISH_REASONS else "stop"
    return "tool_calls" if saw_tool_calls and reason == "stop" else reason


def _tool_call(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    return body if index is None else {"index": index, **body}


def _logprob_entry(chunk: TokenChunk) -> dict[str, Any]:
    return {
        "token": chunk.text,
        "logprob": chunk.logprob,
        "bytes": list(chunk.text.encode()),
        "top_logprobs": [
            {"token": top.token, "logprob": top.logprob, "bytes": list(top.token.encode())}
            for top in chunk.top_logprobs or []
        ],
    }


_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
"""What `json.dumps(..., separators=(",", ":"), ensure_ascii=False)` would build anew for
every event (one per streamed token)."""


def sse_event(payload: dict[str, Any] | str) -> str:
    """One server-sent event: `data: <json>` and a blank line."""
    data = payload if isinstance(payload, str) else _COMPACT_JSON.encode(payload)
    return f"data: {data}\n\n"


SSE_DONE = sse_event("[DONE]")


def sse_error(error: ApiError) -> list[str]:
    """How a stream that already answered 200 reports a failure: an error event (the OpenAI
    SDK raises it as an `APIError`), then `[DONE]`."""
    return [sse_event(openai_error_body(error)), SSE_DONE]


@dataclass
class ChatStreamEncoder:
    """Serialises one completion's chunks as `chat.completion.chunk` SSE events.

    `start()` first (the role chunk), `chunk_to_sse()` per token chunk, then `finish()` (the
    finish_reason chunk, the usage chunk when asked for, `[DONE]`) or `sse_error` on failure.
    """

    command_id: str
    model: str
    created: int
    include_usage: bool = False
    logprobs: bool = False
    index: int = 0
    """The choice this encoder's chunks belong to (n > 1)."""
    one_of_several: bool = False
    """One of several interleaved choices: `finish()` ends this choice only; the caller
    sends the summed usage (`usage_chunk`) and `[DONE]` once every choice has finished."""
    _finish_reason: str | None = field(default=None, init=False)
    _usage: Usage | None = field(default=None, init=False)
    _tool_calls: int = field(default=0, init=False)
    _completion_tokens: int = field(default=0, init=False)

    def _chunk(self, delta: dict[str, Any], *, finish_reason: str | None = None,
               logprobs: dict[str, Any] | None = None) -> str:
        body: dict[str, Any] = {
            "id": completion_id(self.command_id),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        }
        if self.include_usage:
            body["usage"] = None  # OpenAI: every chunk but the last carries a null usage
        return sse_event(body)

    def start(self) -> list[str]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def chunk_to_sse(self, chunk: TokenChunk) -> list[str]:
        if chunk.finish_reason is not None:
            self._finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self._usage = chunk.usage
        self._completion_tokens += 1
        delta: dict[str, Any] = {}
        if chunk.text:
            delta["reasoning_content" if chunk.reasoning else "content"] = chunk.text
        if chunk.tool_calls:
            delta["tool_calls"] = [_tool_call(call, self._tool_calls + i) for i, call in enumerate(chunk.tool_calls)]
            self._tool_calls += len(chunk.tool_calls)
        if not delta:
            return []
        logprobs = {"content": [_logprob_entry(chunk)]} if self.logprobs and chunk.logprob is not None else None
        return [self._chunk(delta, logprobs=logprobs)]

    @property
    def usage(self) -> Usage:
        """This choice's usage as reported (counted from its chunks if it never was)."""
        return self._usage or Usage(completion_tokens=self._completion_tokens, total_tokens=self._completion_tokens)

    def usage_chunk(self, usage: Usage) -> str:
        """The final `choices: []` chunk carrying `usage` (`stream_options.include_usage`)."""
        return sse_event({
            "id": completion_id(self.command_id),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": _usage(usage),
        })

    def finish(self) -> list[str]:
        events = [self._chunk({}, finish_reason=_finish_reason(self._finish_reason, self._tool_calls > 0))]
        if self.one_of_several:
            return events
        if self.include_usage:
            events.append(self.usage_chunk(self.usage))
        events.append(SSE_DONE)
        return events

    def closing(self, encoders: Sequence[ChatStreamEncoder]) -> list[str]:
        """After every one of several choices finished: their summed usage (when asked for)
        and `[DONE]`."""
        events = [self.usage_chunk(summed_usage([e.usage for e in encoders]))] if self.include_usage else []
        return [*events, SSE_DONE]


def collect_response(
    chunks: Iterable[TokenChunk], *, command_id: str, model: str, created: int, logprobs: bool = False
) -> dict[str, Any]:
    """The non-streaming `chat.completion` for a completed stream's chunks."""
    content: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[ToolCall] = []
    entries: list[dict[str, Any]] = []
    finish_reason: str | None = None
    usage: Usage | None = None
    count = 0
    for chunk in chunks:
        count += 1
        (reasoning if chunk.reasoning else content).append(chunk.text)
        tool_calls.extend(chunk.tool_calls or [])
        if logprobs and chunk.logprob is not None and not chunk.reasoning:
            entries.append(_logprob_entry(chunk))
        finish_reason = chunk.finish_reason or finish_reason
        usage = chunk.usage or usage
    text = "".join(content)
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not tool_calls else None}
    if tool_calls:
        message["tool_calls"] = [_tool_call(call) for call in tool_calls]
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    usage = usage or Usage(completion_tokens=count, total_tokens=count)
    return {
        "id": completion_id(command_id),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": {"content": entries} if logprobs else None,
            "finish_reason": _finish_reason(finish_reason, bool(tool_calls)),
        }],
        "usage": _usage(usage),
    }


# ---------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------


def model_entry(model_id: str, context_length: int, created: int, capacity: InstanceCapacity | None = None) -> dict[str, Any]:
    """One `model` object. Skulk's extra fields: `context_length` (tokens the placement
    serves) and, when the capacity planner sized the placement, what it found:
    `effective_context_tokens`, `hot_kv_tokens` and `gpu_layers` (of `num_layers`)."""
    entry: dict[str, Any] = {
        "id": model_id, "object": "model", "created": created, "owned_by": "skulk", "context_length": context_length,
    }
    if capacity is not None:
        entry |= {
            "effective_context_tokens": capacity.effective_context_tokens,
            "hot_kv_tokens": capacity.hot_kv_tokens,
            "gpu_layers": capacity.gpu_layers,
            "num_layers": capacity.num_layers,
        }
    return entry


def served_by(instances: Iterable[Instance], model_id: str) -> Instance | None:
    """The instance a model is listed with: the one with the largest stamped context."""
    candidates = [i for i in instances if i.model_id == model_id]
    return max(candidates, key=lambda i: (i.context_token_limit, i.instance_id), default=None)


def model_list(instances: Iterable[Instance], created: int) -> dict[str, Any]:
    """`GET /v1/models`: each model with a placed instance once, described by the instance
    with the largest context (`served_by`)."""
    placed = list(instances)
    entries: list[dict[str, Any]] = []
    for model_id in sorted({i.model_id for i in placed}):
        best = served_by(placed, model_id)
        assert best is not None
        entries.append(model_entry(model_id, best.context_token_limit, created, best.capacity))
    return {"object": "list", "data": entries}


__all__ = [
    "COMPLETION_ID_PREFIX",
    "MAX_STOP_SEQUENCES",
    "MAX_TOP_LOGPROBS",
    "MIN_TOP_P",
    "SSE_DONE",
    "ChatCompletionRequest",
    "ChatStreamEncoder",
    "ContentPart",
    "Message",
    "StreamOptions",
    "Tool",
    "collect_response",
    "command_id_from",
    "completion_id",
    "image_urls",
    "model_entry",
    "model_list",
    "parse_request",
    "served_by",
    "sse_error",
    "sse_event",
    "to_params",
]
