"""The OpenAI Responses wire format (`POST /v1/responses`), both ways, stateless.

Incoming: `ResponsesRequest` (`input` as a string or a list of message items, `instructions`
as the system message, `max_output_tokens`, sampling) and `to_params`, which normalises it
into chat `TextGenerationParams` or raises `InvalidRequest` naming the parameter at fault.
Every field of the Open Responses request is declared: each is honoured (penalties,
`top_logprobs`, `max_tool_calls`, `parallel_tool_calls`, echoed identifiers) or refused with a
400 naming it when a client sets it (`background`, other service tiers, `truncation: auto`,
`reasoning` settings, conversations, prompt templates); an unknown field is refused too.

Outgoing: `collect_response` builds one `response` object; `ResponseStreamEncoder` emits the
documented event sequence (`response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`*,
`response.output_text.done`, `response.content_part.done`, `response.output_item.done`,
then `response.completed`, or `response.incomplete` when cut by `max_output_tokens`), each
as `event: <type>` + `data: <json>` with increasing `sequence_number`; no `[DONE]`.

Images: `input_image` parts in user messages (`image_url`: a `data:` URL or an http(s) URL
the route has fetched, `image_urls`) become the message's checked images
(`skulk.api.media`); `file_id` images are refused (no Files API).

Pure translation only: no streams, commands or cluster here.
"""

# The OpenAI adapters share openai_chat's request helpers (`_in_range`, `_Lenient`, ...):
# one wire family, one set of checks, kept private to the adapters package.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from skulk.api import media, request_options
from skulk.api.adapters.openai_chat import MAX_TOP_LOGPROBS, MIN_TOP_P, _in_range, _Lenient, _logprob_entry
from skulk.api.errors import ApiError, InvalidRequest, invalid_request_from_validation
from skulk.api.strict_tools import check_strict_schemas
from skulk.api.tool_calls import check_enforceable
from skulk.shared.json_shapes import is_json_object
from skulk.shared.sampling_defaults import DEFAULT_TEMPERATURE, DEFAULT_TOP_P
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.common import ChatMessage, ChatRole, ToolCall, ToolSpec, Usage
from skulk.shared.types.ids import ModelId
from skulk.shared.types.media import IMAGE_MARKER, ImageInput
from skulk.shared.types.tasks import TextGenerationParams

RESPONSE_ID_PREFIX = "resp_"
MESSAGE_ID_PREFIX = "msg_"
REASONING_ID_PREFIX = "rs_"

_ROLES: dict[str, ChatRole] = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_REASONING_PARTS = frozenset({"reasoning_text", "summary_text"})


class InputPart(_Lenient):
    type: str
    text: str | None = None
    image_url: str | None = None
    """On `input_image`: an https or `data:` URL (`skulk.api.media`)."""
    file_id: str | None = None
    detail: str | None = None


class InputItem(_Lenient):
    type: str | None = "message"
    role: str | None = None
    content: str | list[InputPart] | None = None
    call_id: str | None = None
    """On `function_call` (a call the model made) and `function_call_output` (its result)."""
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    encrypted_content: str | None = None
    """On a `compaction` item (what `/v1/responses/compact` returned): the summary."""
    summary: list[InputPart] | None = None
    """On a `reasoning` item: its summary parts (used when it has no `content`)."""


class ResponsesRequest(BaseModel):
    """Every field of the Open Responses request; any other is refused by name (`to_params`),
    and each field the engines cannot honour is refused when a client sets it."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    """Not OpenAI's; the common server extension, as on chat completions."""
    seed: int | None = None
    stream: bool | None = False
    previous_response_id: str | None = None
    store: bool | None = None
    """Keep this response (on the node that answers, for an hour, for this API key) so a
    later request can continue it with `previous_response_id`. Default true, as OpenAI."""
    tools: list[dict[str, Any]] | None = None
    """Function tools, flat: `{"type": "function", "name", "description", "parameters"}`."""
    tool_choice: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    text: dict[str, Any] | None = None
    """`text.format`: structured output (`json_object`, `json_schema`)."""
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_logprobs: int | None = None
    """Alternatives per output token, reported on each output_text part (and delta)."""
    max_tool_calls: int | None = None
    """Most function calls one response returns; the model's later calls are dropped."""
    parallel_tool_calls: bool | None = None
    """False: at most one function call per response."""
    include: list[str] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    """Echoed; every request reuses the node's prefix cache without a key."""
    prompt_cache_retention: str | None = None
    background: bool | None = None
    service_tier: str | None = None
    reasoning: dict[str, Any] | None = None
    truncation: str | None = None
    stream_options: dict[str, Any] | None = None
    conversation: Any = None
    prompt: Any = None


COMPACTION_ID_PREFIX = "cmp_"
SUMMARY_LEAD = "Summary of our conversation so far:\n"
"""How a compaction item's summary reads to the model: an assistant turn that carries it."""
COMPACTION_PROMPT = (
    "Write a summary of this whole conversation that lets it be continued from the summary alone: "
    "keep every fact, decision, name, number and open task; leave out pleasantries. "
    "Reply with the summary only."
)
"""The instruction the compaction pass ends the conversation with (`/v1/responses/compact`)."""


def _reasoning_text(item: InputItem, where: str) -> str:
    """A reasoning item's text: its `reasoning_text` parts, else its summary. An item that
    carries only another provider's `encrypted_content` has none (it is dropped)."""
    if isinstance(item.content, str):
        return item.content
    parts = item.content or item.summary or []
    for part_index, part in enumerate(parts):
        if part.type not in _REASONING_PARTS:
            raise InvalidRequest(f"Reasoning parts of type {part.type!r} are not supported; only 'reasoning_text' "
                                 "and 'summary_text' are.", param=f"{where}.content[{part_index}].type")
    return "\n".join(part.text or "" for part in parts)


def image_urls(request: ResponsesRequest) -> list[tuple[str, str]]:
    """The http(s) image URLs of a request's `input_image` parts, each with the field naming
    it: the route fetches them (`skulk.api.image_fetch`) before `to_params`."""
    urls: list[tuple[str, str]] = []
    for index, item in enumerate(request.input if isinstance(request.input, list) else []):
        for part_index, part in enumerate(item.content if isinstance(item.content, list) else []):
            if part.type == "input_image" and part.image_url and media.is_fetched_url(part.image_url):
                urls.append((part.image_url, f"input[{index}].content[{part_index}].image_url"))
    return urls


def _input_image(part: InputPart, at: str, fetched: Mapping[str, bytes]) -> ImageInput:
    if part.file_id is not None:
        raise InvalidRequest("Images by 'file_id' are not served (there is no Files API); send 'image_url'.",
                             param=f"{at}.file_id")
    if not part.image_url:
        raise InvalidRequest("An input_image part needs 'image_url'.", param=f"{at}.image_url")
    detail = media.check_detail(part.detail, f"{at}.detail")
    return media.image_from_url(part.image_url, fetched, f"{at}.image_url", detail)


def _item_message(item: InputItem, index: int, fetched: Mapping[str, bytes] | None = None) -> ChatMessage:
    where = f"input[{index}]"
    if item.type == "reasoning":
        # The reasoning of the assistant turn that follows (`_merge_turns` joins them).
        return ChatMessage(role="assistant", content=None, reasoning_content=_reasoning_text(item, where) or None)
    if item.type == "compaction":
        # Skulk's compaction items carry the summary itself (opaque to clients, not encrypted).
        if not item.encrypted_content:
            raise InvalidRequest("A compaction item needs its 'encrypted_content'.",
                                 param=f"{where}.encrypted_content")
        return ChatMessage(role="assistant", content=SUMMARY_LEAD + item.encrypted_content)
    if item.type in ("function_call", "function_call_output"):
        if not item.call_id:
            raise InvalidRequest(f"A {item.type} item needs its 'call_id'.", param=f"{where}.call_id")
        if item.type == "function_call":
            if not item.name:
                raise InvalidRequest("A function_call item needs the function's 'name'.", param=f"{where}.name")
            return ChatMessage(role="assistant", content=None,
                               tool_calls=[ToolCall(id=item.call_id, name=item.name, arguments=item.arguments or "")])
        return ChatMessage(role="tool", content=item.output or "", tool_call_id=item.call_id)
    if item.type not in (None, "message"):
        raise InvalidRequest(f"Input items of type {item.type!r} are not supported; only messages, function_call, "
                             "function_call_output, reasoning and compaction are.", param=f"{where}.type")
    role = _ROLES.get(item.role or "")
    if role is None:
        raise InvalidRequest(f"Invalid role {item.role!r}; expected one of {', '.join(sorted(_ROLES))}.",
                             param=f"{where}.role")
    if item.content is None:
        raise InvalidRequest("A message item needs 'content'.", param=f"{where}.content")
    if isinstance(item.content, str):
        return ChatMessage(role=role, content=media.check_text(item.content, f"{where}.content"))
    texts: list[str] = []
    images: list[ImageInput] = []
    for part_index, part in enumerate(item.content):
        at = f"{where}.content[{part_index}]"
        if part.type == "input_image" and role == "user":
            images.append(_input_image(part, at, fetched or {}))
            texts.append(IMAGE_MARKER)
            continue
        if part.type not in _TEXT_PARTS:
            raise InvalidRequest(f"Content parts of type {part.type!r} are not supported; only 'input_text' and "
                                 "(in a user message) 'input_image' are.", param=f"{at}.type")
        if part.text is None:
            raise InvalidRequest("A text content part needs 'text'.", param=f"{at}.text")
        texts.append(media.check_text(part.text, f"{at}.text") or "")
    return ChatMessage(role=role, content="\n".join(texts), images=images)


def _reasoning_only(message: ChatMessage) -> bool:
    return message.role == "assistant" and message.content is None and not message.tool_calls


def _merge_turns(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Input items as chat turns: consecutive function_call items are one assistant turn
    that made several calls, and a reasoning item is the reasoning of the assistant turn
    after it (a reasoning item with nothing after it, or with no text, is dropped)."""
    merged: list[ChatMessage] = []
    for message in messages:
        previous = merged[-1] if merged else None
        if previous is not None and _reasoning_only(previous) and message.role == "assistant":
            reasoning = "\n".join(r for r in (previous.reasoning_content, message.reasoning_content) if r)
            merged[-1] = message.model_copy(update={"reasoning_content": reasoning or None})
        elif (previous is not None and message.role == previous.role == "assistant" and message.tool_calls
                and previous.tool_calls and not message.content):
            merged[-1] = previous.model_copy(update={"tool_calls": [*previous.tool_calls, *message.tool_calls]})
        else:
            if previous is not None and _reasoning_only(previous):
                merged.pop()
            merged.append(message)
    if merged and _reasoning_only(merged[-1]):
        merged.pop()
    return merged


def _tools(request: ResponsesRequest) -> list[ToolSpec]:
    specs: list[ToolSpec] = []
    for index, tool in enumerate(request.tools or []):
        if tool.get("type") != "function":
            raise InvalidRequest(f"Tools of type {tool.get('type')!r} are not supported; only 'function' is (Skulk "
                                 "runs no hosted tools).", param=f"tools[{index}].type")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise InvalidRequest("A function tool needs a 'name'.", param=f"tools[{index}].name")
        parameters: object = tool.get("parameters") or {}
        if not is_json_object(parameters):
            raise InvalidRequest("A function tool's 'parameters' must be a JSON Schema object.",
                                 param=f"tools[{index}].parameters")
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidRequest("A function tool's 'strict' must be a boolean.", param=f"tools[{index}].strict")
        specs.append(ToolSpec(name=tool["name"], description=tool.get("description") or "", parameters=parameters,
                              strict=bool(strict)))
    return specs


def _tool_choice(choice: str | dict[str, Any] | None, tools: list[ToolSpec]) -> str | dict[str, Any] | None:
    """Responses' tool_choice as the internal (Chat Completions) one."""
    if choice is None or isinstance(choice, str):
        if choice is not None and choice not in ("none", "auto", "required"):
            raise InvalidRequest(f"Invalid tool_choice {choice!r}; expected 'none', 'auto', 'required' or a function.",
                                 param="tool_choice")
        if choice == "required" and not tools:
            raise InvalidRequest("tool_choice 'required' needs 'tools'.", param="tool_choice")
        return choice
    name = choice.get("name")
    if choice.get("type") != "function" or not isinstance(name, str):
        raise InvalidRequest('A tool_choice object must be {"type": "function", "name": ...}.', param="tool_choice")
    if name not in {t.name for t in tools}:
        raise InvalidRequest(f"tool_choice names {name!r}, which is not among 'tools'.", param="tool_choice")
    return {"type": "function", "function": {"name": name}}


LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The one `include` value Skulk serves (the same as `top_logprobs`: each token's logprob)."""
SERVICE_TIERS = frozenset({"auto", "default"})
CACHE_RETENTIONS = frozenset({"in_memory"})
"""The node's prefix cache lives in memory; nothing is kept for 24 h."""


def _refuse_unhonoured(request: ResponsesRequest) -> None:
    """InvalidRequest naming the first field a client set that Skulk cannot honour."""
    for name in sorted(request.model_extra or {}):
        raise InvalidRequest(f"'{name}' is not a Responses parameter Skulk serves.", param=name)
    refusals: list[tuple[bool, str, str]] = [
        (bool(request.background), "background", "Background responses are not supported: send the request "
         "without it (stream it to follow it as it is made)."),
        (request.service_tier not in (None, *SERVICE_TIERS), "service_tier",
         f"Service tier {request.service_tier!r} is not offered; use 'auto' or 'default'."),
        (request.truncation not in (None, "disabled"), "truncation",
         "Only 'disabled' truncation is served: an input longer than the context is a 400, never cut silently."),
        (request.prompt_cache_retention not in (None, *CACHE_RETENTIONS), "prompt_cache_retention",
         "The prompt cache is kept in memory only ('in_memory')."),
        (request.conversation is not None, "conversation",
         "Conversations are not supported; continue a response with 'previous_response_id'."),
        (request.prompt is not None, "prompt", "Stored prompt templates are not supported; send 'input'."),
        (any(v is not None for k, v in (request.reasoning or {}).items() if k != "effort"), "reasoning",
         "Reasoning summaries are not served; 'reasoning' takes an 'effort' only."),
        (any(k != "include_obfuscation" or v for k, v in (request.stream_options or {}).items()), "stream_options",
         "Stream obfuscation is not served; send 'stream_options' without it."),
    ]
    for refused, param, message in refusals:
        if refused:
            raise InvalidRequest(message, param=param)
    for index, item in enumerate(request.include or []):
        if item != LOGPROBS_INCLUDE:
            raise InvalidRequest(f"include value {item!r} is not served (only {LOGPROBS_INCLUDE!r}).",
                                 param=f"include[{index}]")
    if request.max_tool_calls is not None and request.max_tool_calls < 0:
        raise InvalidRequest(f"'max_tool_calls' must be at least 0, got {request.max_tool_calls}.",
                             param="max_tool_calls")


def to_params(request: ResponsesRequest, history: Sequence[ChatMessage] = (),
              fetched: Mapping[str, bytes] | None = None) -> TextGenerationParams:
    """Chat generation params for a Responses request, or `InvalidRequest` naming the param.
    `history` is the stored conversation `previous_response_id` continues (the route looks
    it up): it comes after this request's `instructions` and before its `input`. `fetched`:
    the bodies of its http(s) image URLs (`image_urls`), as the route fetched them."""
    if not request.model.strip():
        raise InvalidRequest("'model' must name a model.", param="model")
    _refuse_unhonoured(request)
    if request.top_logprobs is not None:
        _in_range(request.top_logprobs, 0, MAX_TOP_LOGPROBS, "top_logprobs")
    tools = _tools(request)
    tool_choice = _tool_choice(request.tool_choice, tools)
    check_enforceable(tools, tool_choice, lambda index: f"tools[{index}].parameters")
    check_strict_schemas(tools, lambda index: f"tools[{index}].parameters")
    if request.max_output_tokens is not None and request.max_output_tokens < 1:
        raise InvalidRequest(f"'max_output_tokens' must be at least 1, got {request.max_output_tokens}.",
                             param="max_output_tokens")
    if request.top_k is not None and request.top_k < 0:
        raise InvalidRequest(f"'top_k' must be at least 0, got {request.top_k}.", param="top_k")
    temperature = _in_range(request.temperature, 0.0, 2.0, "temperature")
    top_p = _in_range(request.top_p, 0.0, 1.0, "top_p")
    messages = [ChatMessage(role="system", content=media.check_text(request.instructions, "instructions"))] \
        if request.instructions else []
    messages.extend(history)
    if isinstance(request.input, str):
        messages.append(ChatMessage(role="user", content=media.check_text(request.input, "input")))
    else:
        if not request.input:
            raise InvalidRequest("'input' must contain at least one item.", param="input")
        messages.extend(_merge_turns([_item_message(item, i, fetched) for i, item in enumerate(request.input)]))
    try:
        return TextGenerationParams(
            model_id=ModelId(request.model),
            messages=messages,
            max_tokens=request.max_output_tokens,
            temperature=temperature,
            top_p=None if top_p is None else max(top_p, MIN_TOP_P),
            top_k=request.top_k,
            seed=request.seed,
            stream=bool(request.stream),
            presence_penalty=request_options.penalty(request.presence_penalty, "presence_penalty"),
            frequency_penalty=request_options.penalty(request.frequency_penalty, "frequency_penalty"),
            logprobs=wants_logprobs(request),
            **request_options.reasoning_choice((request.reasoning or {}).get("effort"), "reasoning.effort"),
            top_logprobs=request.top_logprobs if wants_logprobs(request) else None,
            tools=tools,
            tool_choice=tool_choice,
            response_format=request_options.responses_text_format((request.text or {}).get("format")),
        )
    except ValidationError as error:
        raise invalid_request_from_validation(error) from None


# ---------------------------------------------------------------------------------------
# Response pieces
# ---------------------------------------------------------------------------------------


def response_id(command_id: str) -> str:
    return f"{RESPONSE_ID_PREFIX}{command_id}"


def message_id(command_id: str) -> str:
    return f"{MESSAGE_ID_PREFIX}{command_id}"


def reasoning_id(command_id: str) -> str:
    return f"{REASONING_ID_PREFIX}{command_id}"


def _usage(usage: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, usage.completion_tokens)},
        "total_tokens": usage.total_tokens,
    }


def _text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def wants_logprobs(request: ResponsesRequest) -> bool:
    return request.top_logprobs is not None or LOGPROBS_INCLUDE in (request.include or [])


def _logprobs_of(request: ResponsesRequest, chunk: TokenChunk) -> list[dict[str, Any]]:
    """The output token's logprob entry (with its alternatives), when the request asked."""
    if not wants_logprobs(request) or chunk.logprob is None or chunk.reasoning:
        return []
    return [_logprob_entry(chunk)]


def capped_calls(request: ResponsesRequest, calls: list[ToolCall]) -> list[ToolCall]:
    """The calls a response returns: one when `parallel_tool_calls` is false, at most
    `max_tool_calls`; the model's later calls are dropped (the caller asked for no more)."""
    limit = len(calls)
    if request.parallel_tool_calls is False:
        limit = min(limit, 1)
    if request.max_tool_calls is not None:
        limit = min(limit, request.max_tool_calls)
    return calls[:limit]


def _echoed_tools(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The tools as the response reports them: each function tool with its `strict`."""
    return [{**tool, "strict": bool(tool.get("strict", False))} if tool.get("type") == "function" else tool
            for tool in request.tools or []]


def _message(command_id: str, status: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": message_id(command_id), "type": "message", "status": status, "role": "assistant", "content": parts}


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def _reasoning_item(command_id: str, status: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The model's reasoning, as its own output item before the answer (its text in
    `content`; Skulk writes no summaries and encrypts nothing)."""
    return {"id": reasoning_id(command_id), "type": "reasoning", "status": status, "summary": [], "content": parts}


def response_object(
    request: ResponsesRequest, *, command_id: str, created: int, status: str,
    output: list[dict[str, Any]], usage: Usage | None = None, error: dict[str, Any] | None = None,
    completed_at: int | None = None, reasoning_tokens: int = 0,
) -> dict[str, Any]:
    """A `response` object in any state (`in_progress`, `completed`, `incomplete`, `failed`),
    with every field the Open Responses specification requires. The sampling values are the
    ones used: the request's, else the engines' defaults (numbers, never null)."""
    return {
        "id": response_id(command_id),
        "object": "response",
        "created_at": created,
        "completed_at": completed_at if status == "completed" else None,
        "status": status,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "temperature": DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
        "top_p": DEFAULT_TOP_P if request.top_p is None else request.top_p,
        "presence_penalty": request.presence_penalty or 0.0,
        "frequency_penalty": request.frequency_penalty or 0.0,
        "top_logprobs": request.top_logprobs or 0,
        "reasoning": ({"effort": effort, "summary": None}
                      if (effort := (request.reasoning or {}).get("effort")) is not None else None),
        "tool_choice": request.tool_choice or "auto",
        "tools": _echoed_tools(request),
        "store": request.store is not False,
        "background": False,
        "service_tier": "default",
        "text": {"format": (request.text or {}).get("format") or {"type": "text"}},
        "truncation": "disabled",
        "usage": None if usage is None else _usage(usage, reasoning_tokens),
        "user": request.user,
        "metadata": request.metadata or {},
        "safety_identifier": request.safety_identifier,
        "prompt_cache_key": request.prompt_cache_key,
    }


def _final_status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def _function_call(call: ToolCall) -> dict[str, Any]:
    return {"id": f"fc_{call.id}", "type": "function_call", "status": "completed", "call_id": call.id,
            "name": call.name, "arguments": call.arguments}


def conversation_of(params: TextGenerationParams, request: ResponsesRequest,
                    response: dict[str, Any]) -> tuple[ChatMessage, ...]:
    """The conversation a stored `response` continues into: its history and input (not
    its `instructions`, which a continuation does not inherit, as OpenAI's do not) and its
    output as one assistant turn (text and function calls)."""
    messages = params.messages[1:] if request.instructions else params.messages

    def text_of(kind: str) -> str:
        return "".join(part.get("text", "") for item in response["output"] if item["type"] == kind
                       for part in item["content"])

    calls = [ToolCall(id=item["call_id"], name=item["name"], arguments=item["arguments"])
             for item in response["output"] if item["type"] == "function_call"]
    text = text_of("message")
    return (*messages, ChatMessage(role="assistant", content=text or None if calls else text, tool_calls=calls,
                                   reasoning_content=text_of("reasoning") or None))


def collect_response(
    chunks: Iterable[TokenChunk], *, command_id: str, request: ResponsesRequest, created: int,
    completed_at: int | None = None,
) -> dict[str, Any]:
    """The non-streaming `response` for a completed stream's chunks."""
    texts: list[str] = []
    thoughts: list[str] = []
    logprobs: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    finish_reason: str | None = None
    usage: Usage | None = None
    count = 0
    for chunk in chunks:
        count += 1
        if chunk.reasoning:
            thoughts.append(chunk.text)
        else:
            texts.append(chunk.text)
            logprobs += _logprobs_of(request, chunk)
        calls.extend(chunk.tool_calls or [])
        finish_reason = chunk.finish_reason or finish_reason
        usage = chunk.usage or usage
    status = _final_status(finish_reason)
    text = "".join(texts)
    calls = capped_calls(request, calls)
    thought = "".join(thoughts)
    output = [_reasoning_item(command_id, status, [_reasoning_part(thought)])] if thought else []
    output += [_message(command_id, status, [_text_part(text, logprobs)])] if text or not calls else []
    output += [_function_call(call) for call in calls]
    return response_object(request, command_id=command_id, created=created, status=status, output=output,
                           usage=usage or Usage(completion_tokens=count, total_tokens=count),
                           completed_at=completed_at if completed_at is not None else created,
                           reasoning_tokens=sum(1 for _ in thoughts))


@dataclass
class ResponseStreamEncoder:
    """The Responses streaming events for one response; `error_events` on failure.

    Output items open as their text arrives: leading reasoning as a `reasoning` item
    (`response.reasoning_text.delta` events), then the answer as a `message` item
    (`response.output_text.delta`), then the function calls once the output is complete.
    The message item is always present, empty when the model only called tools."""

    command_id: str
    request: ResponsesRequest
    created: int
    on_done: Callable[[dict[str, Any]], None] | None = None
    """Called with the final response object (the route stores it)."""
    clock: Callable[[], int] | None = None
    """Unix seconds now, for `completed_at` (None: the creation time)."""
    sse: bool = True
    """Each event as an SSE block; False: its JSON alone (one WebSocket text frame each)."""
    _sequence: int = field(default=0, init=False)
    _texts: list[str] = field(default_factory=list, init=False)
    _thoughts: list[str] = field(default_factory=list, init=False)
    _reasoning_chunks: int = field(default=0, init=False)
    _items: list[dict[str, Any]] = field(default_factory=list, init=False)
    """The output items done so far (the reasoning item, once the answer begins)."""
    _open: str | None = field(default=None, init=False)
    """The kind of the item now streaming: "reasoning", "message" or None."""
    _logprobs: list[dict[str, Any]] = field(default_factory=list, init=False)
    _calls: list[ToolCall] = field(default_factory=list, init=False)
    _finish_reason: str | None = field(default=None, init=False)
    _usage: Usage | None = field(default=None, init=False)
    _count: int = field(default=0, init=False)

    def _event(self, type_: str, **fields: Any) -> str:
        payload = {"type": type_, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
        return f"event: {type_}\ndata: {data}\n\n" if self.sse else data

    def _response(self, status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return response_object(self.request, command_id=self.command_id, created=self.created, status=status,
                               output=output, reasoning_tokens=self._reasoning_chunks, **extra)

    def _where(self) -> dict[str, Any]:
        item_id = reasoning_id(self.command_id) if self._open == "reasoning" else message_id(self.command_id)
        return {"item_id": item_id, "output_index": len(self._items), "content_index": 0}

    def start(self) -> list[str]:
        return [
            self._event("response.created", response=self._response("in_progress", [])),
            self._event("response.in_progress", response=self._response("in_progress", [])),
        ]

    def _begin(self, kind: str) -> list[str]:
        """Close the item now streaming (reasoning) and open one of `kind`."""
        events = self._close_reasoning("completed") if self._open == "reasoning" else []
        self._open = kind
        index = len(self._items)
        if kind == "reasoning":
            item, part = _reasoning_item(self.command_id, "in_progress", []), _reasoning_part("")
        else:
            item, part = _message(self.command_id, "in_progress", []), _text_part("")
        return [*events, self._event("response.output_item.added", output_index=index, item=item),
                self._event("response.content_part.added", part=part, **self._where())]

    def _close_reasoning(self, status: str) -> list[str]:
        text = "".join(self._thoughts)
        item = _reasoning_item(self.command_id, status, [_reasoning_part(text)])
        events = [
            self._event("response.reasoning_text.done", text=text, **self._where()),
            self._event("response.content_part.done", part=_reasoning_part(text), **self._where()),
            self._event("response.output_item.done", output_index=len(self._items), item=item),
        ]
        self._items.append(item)
        self._open = None
        return events

    def chunk_to_sse(self, chunk: TokenChunk) -> list[str]:
        self._count += 1
        self._finish_reason = chunk.finish_reason or self._finish_reason
        self._usage = chunk.usage or self._usage
        self._calls.extend(chunk.tool_calls or [])
        if not chunk.text:
            return []
        if chunk.reasoning:
            self._reasoning_chunks += 1
            if self._open == "message" or any(item["type"] == "message" for item in self._items):
                return []  # reasoning after the answer began has no item of its own
            events = self._begin("reasoning") if self._open is None else []
            self._thoughts.append(chunk.text)
            return [*events, self._event("response.reasoning_text.delta", delta=chunk.text, **self._where())]
        events = self._begin("message") if self._open != "message" else []
        self._texts.append(chunk.text)
        logprobs = _logprobs_of(self.request, chunk)
        self._logprobs += logprobs
        return [*events, self._event("response.output_text.delta", delta=chunk.text, logprobs=logprobs,
                                     **self._where())]

    def finish(self) -> list[str]:
        status = _final_status(self._finish_reason)
        events = self._begin("message") if self._open != "message" else []
        text = "".join(self._texts)
        item = _message(self.command_id, status, [_text_part(text, self._logprobs)])
        usage = self._usage or Usage(completion_tokens=self._count, total_tokens=self._count)
        events += [
            self._event("response.output_text.done", text=text, logprobs=self._logprobs, **self._where()),
            self._event("response.content_part.done", part=_text_part(text, self._logprobs), **self._where()),
            self._event("response.output_item.done", output_index=len(self._items), item=item),
        ]
        output = [*self._items, item]
        for index, call in enumerate(capped_calls(self.request, self._calls), start=len(output)):
            done = _function_call(call)
            where = {"item_id": done["id"], "output_index": index}
            events += [
                self._event("response.output_item.added", output_index=index,
                            item={**done, "status": "in_progress", "arguments": ""}),
                self._event("response.function_call_arguments.delta", delta=call.arguments, **where),
                self._event("response.function_call_arguments.done", arguments=call.arguments, **where),
                self._event("response.output_item.done", output_index=index, item=done),
            ]
            output.append(done)
        final = self._response(status, output, usage=usage,
                               completed_at=self.clock() if self.clock is not None else self.created)
        if self.on_done is not None:
            self.on_done(final)
        return [*events, self._event(f"response.{status}", response=final)]

    def error_events(self, error: ApiError) -> list[str]:
        """A failure after the 200: an `error` event, then `response.failed` with what was
        produced so far (the reasoning, then the answer's text)."""
        output = list(self._items)
        if self._thoughts and self._open == "reasoning":
            output.append(_reasoning_item(self.command_id, "incomplete", [_reasoning_part("".join(self._thoughts))]))
        output.append(_message(self.command_id, "incomplete", [_text_part("".join(self._texts))]))
        return [
            self._event("error", code=error.code, message=error.message, param=error.param),
            self._event("response.failed", response=self._response(
                "failed", output, error={"code": "server_error", "message": error.message})),
        ]


# ---------------------------------------------------------------------------------------
# Compaction (`POST /v1/responses/compact`)
# ---------------------------------------------------------------------------------------


class CompactRequest(BaseModel):
    """The compaction request: a conversation (`previous_response_id` and/or `input`) to fold
    into its user messages and one compaction item. Unknown fields are refused by name."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[InputItem] | None = None
    previous_response_id: str | None = None
    instructions: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None


COMPACTION_MAX_TOKENS = 1024
"""Most tokens a summary may take; a quarter of the placed context when that is less, so the
compacted conversation always fits again with room to go on."""


def compaction_max_tokens(context_tokens: int) -> int:
    return max(1, min(COMPACTION_MAX_TOKENS, context_tokens // 4))


def compaction_params(request: CompactRequest, history: Sequence[ChatMessage] = ()) -> TextGenerationParams:
    """The generation that writes the summary: the conversation, then COMPACTION_PROMPT."""
    if request.input is None and not history:
        raise InvalidRequest("Give the conversation to compact: 'input' and/or 'previous_response_id'.",
                             param="input")
    items = [InputItem(role="user", content=request.input)] if isinstance(request.input, str) \
        else list(request.input or [])
    as_response = ResponsesRequest(model=request.model, input=[*items, InputItem(role="user", content=COMPACTION_PROMPT)],
                                   instructions=request.instructions, service_tier=request.service_tier,
                                   prompt_cache_key=request.prompt_cache_key,
                                   prompt_cache_retention=request.prompt_cache_retention,
                                   **(request.model_extra or {}))
    return to_params(as_response, history)


def compacted(params: TextGenerationParams, chunks: Iterable[TokenChunk], *, command_id: str,
              created: int) -> dict[str, Any]:
    """The `response.compaction` object: every user message of the compacted conversation
    (the compaction prompt aside), then one compaction item holding the summary."""
    chunks = list(chunks)
    summary = "".join(c.text for c in chunks if not c.reasoning).strip()
    usage = next((c.usage for c in reversed(chunks) if c.usage is not None), None) or Usage()
    users = [m for m in params.messages if m.role == "user" and m.content != COMPACTION_PROMPT]
    output: list[dict[str, Any]] = [
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": (m.content or "").replace(IMAGE_MARKER, "").strip()}]}
        for m in users]
    output.append({"type": "compaction", "id": f"{COMPACTION_ID_PREFIX}{command_id}", "encrypted_content": summary})
    return {"id": response_id(command_id), "object": "response.compaction", "created_at": created,
            "output": output, "usage": _usage(usage)}


__all__ = [
    "COMPACTION_MAX_TOKENS",
    "COMPACTION_PROMPT",
    "MESSAGE_ID_PREFIX",
    "RESPONSE_ID_PREFIX",
    "CompactRequest",
    "InputItem",
    "InputPart",
    "ResponseStreamEncoder",
    "ResponsesRequest",
    "capped_calls",
    "collect_response",
    "compacted",
    "compaction_max_tokens",
    "compaction_params",
    "conversation_of",
    "image_urls",
    "message_id",
    "response_id",
    "response_object",
    "to_params",
    "wants_logprobs",
]
