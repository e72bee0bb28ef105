"""The Ollama wire format (`/api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings`,
`/api/tags`, `/api/ps`, `/api/show`, `/api/version`), both ways; Skulk serves it under `/ollama`.

Incoming: `ChatRequest` / `GenerateRequest` with their `options` (temperature, top_p,
top_k, min_p, seed, num_predict, stop, repeat_penalty, frequency_penalty, presence_penalty, and
num_ctx, clamped to the placed context and said in a response header; any other option is
refused naming it: load-time ones such as num_gpu are placement's), `format` ("json" or a JSON
Schema, enforced by constrained decoding), `keep_alive` (the runner's idle TTL from that request on: 0 unloads once idle),
normalised by `chat_params` / `generate_params` into `TextGenerationParams` or an
`InvalidRequest` naming the parameter. Outgoing: `OllamaEncoder` builds the NDJSON lines
(one object per token chunk, then a final `done: true` object with done_reason, token
counts and durations in nanoseconds) and `collect` the single non-streaming object; the
`*_entry` helpers describe placed models from their cards.

Tools: `tools` (OpenAI-shaped function definitions) reach the model's chat template; an
assistant turn's `tool_calls` and `tool` messages (answered by `tool_name`) are passed
back the same way; calls the model makes leave as `message.tool_calls` with arguments as
an object, and reasoning as `message.thinking`.

Images: `images` (base64, no position) on a user message or a generate request become the
message's checked images (`skulk.api.media`), their markers first in its text, as Ollama
places them.

Pure translation only: this module must never touch streams, commands or the cluster.
Note that Ollama's `stream` defaults to true.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from skulk.api import media, request_options
from skulk.api.adapters.openai_chat import Tool  # Ollama's tool definition is OpenAI's shape
from skulk.api.errors import ApiError, InvalidRequest, invalid_request_from_validation, ollama_error_body
from skulk.shared.residency import KeepAliveInvalid, parse_keep_alive
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.common import ChatMessage, ChatRole, ToolCall, ToolSpec, Usage
from skulk.shared.types.ids import ModelId
from skulk.shared.types.instances import Instance
from skulk.shared.types.media import IMAGE_MARKER, ImageInput
from skulk.shared.types.tasks import EmbeddingParams, TextGenerationParams

OLLAMA_VERSION = "0.6.0"
"""The Ollama server version `/api/version` reports; clients use it only to gate features."""

MIN_TOP_P = 1e-6
"""`top_p: 0` keeps only the most likely token; the internal params need a positive nucleus."""

_ROLES: dict[str, ChatRole] = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}

Endpoint = Literal["chat", "generate"]

# ---------------------------------------------------------------------------------------
# Request
# ---------------------------------------------------------------------------------------


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


LOAD_TIME_OPTIONS = frozenset({
    "num_gpu", "main_gpu", "num_thread", "num_batch", "use_mmap", "use_mlock", "low_vram", "numa", "f16_kv",
    "vocab_only", "logits_all", "embedding_only",
})
"""Ollama options that size the model when it loads: on Skulk, placement decides them."""


class Options(BaseModel):
    """Ollama's `options`. Any other option is refused (`check_options`), never ignored."""

    model_config = ConfigDict(extra="allow")

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    num_predict: int | None = None
    stop: str | list[str] | None = None
    repeat_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    num_ctx: int | None = None
    """The context window. Skulk's is fixed when the model is placed: a larger one is
    clamped to it (and the response says so), a smaller one is honoured per request."""


class FunctionCall(_Lenient):
    name: str
    arguments: dict[str, Any] | str | None = None


class MessageToolCall(_Lenient):
    function: FunctionCall
    id: str | None = None


class Message(_Lenient):
    role: str
    content: str | None = None
    images: list[str] | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_name: str | None = None
    thinking: str | None = None


class ChatRequest(_Lenient):
    model: str
    messages: list[Message] = []
    stream: bool = True
    options: Options | None = None
    format: Any = None
    keep_alive: Any = None
    tools: list[Tool] | None = None
    think: Any = None


class GenerateRequest(_Lenient):
    model: str
    prompt: str | None = None
    system: str | None = None
    suffix: str | None = None
    raw: bool | None = None
    stream: bool = True
    options: Options | None = None
    images: list[str] | None = None
    format: Any = None
    keep_alive: Any = None
    think: Any = None


class EmbedRequest(_Lenient):
    """`/api/embed`: one string or a list of them."""

    model: str
    input: str | list[str]
    truncate: bool | None = None
    dimensions: int | None = None
    options: dict[str, Any] | None = None
    keep_alive: Any = None


class LegacyEmbeddingsRequest(_Lenient):
    """`/api/embeddings`, the older single-prompt form."""

    model: str
    prompt: str
    options: dict[str, Any] | None = None
    keep_alive: Any = None


class ShowRequest(_Lenient):
    model: str | None = None
    name: str | None = None
    """The older spelling of `model`."""


def check_options(options: Options) -> None:
    """`InvalidRequest` naming the first option Skulk does not honour, and why."""
    for name, value in (options.model_extra or {}).items():
        if value is None:
            continue
        if name in LOAD_TIME_OPTIONS:
            raise InvalidRequest(f"options.{name} is set when a model is placed, not per request: Skulk's placement "
                                 "chooses it (POST /place_instance).", param=f"options.{name}")
        raise InvalidRequest(f"options.{name} is not supported; the options served are temperature, top_p, top_k, "
                             "min_p, seed, num_predict, stop, repeat_penalty, frequency_penalty, presence_penalty and "
                             "num_ctx.", param=f"options.{name}")


def _sampling(options: Options | None) -> dict[str, Any]:
    options = options or Options()
    check_options(options)
    if options.temperature is not None and not options.temperature >= 0:
        raise InvalidRequest(f"options.temperature must be at least 0, got {options.temperature}",
                             param="options.temperature")
    if options.top_p is not None and not (0 <= options.top_p <= 1):
        raise InvalidRequest(f"options.top_p must be between 0 and 1, got {options.top_p}", param="options.top_p")
    if options.top_k is not None and options.top_k < 0:
        raise InvalidRequest(f"options.top_k must be at least 0, got {options.top_k}", param="options.top_k")
    if options.min_p is not None and not (0 <= options.min_p <= 1):
        raise InvalidRequest(f"options.min_p must be between 0 and 1, got {options.min_p}", param="options.min_p")
    if options.num_predict == 0:
        raise InvalidRequest("options.num_predict must not be 0", param="options.num_predict")
    if options.num_ctx is not None and options.num_ctx < 1:
        raise InvalidRequest(f"options.num_ctx must be at least 1, got {options.num_ctx}", param="options.num_ctx")
    # Ollama: num_predict -1 is "no limit" and -2 "fill the context"; both leave it to the context.
    max_tokens = options.num_predict if options.num_predict is not None and options.num_predict > 0 else None
    stops = [options.stop] if isinstance(options.stop, str) else list(options.stop or [])
    return {
        "temperature": options.temperature,
        "top_p": None if options.top_p is None else max(options.top_p, MIN_TOP_P),
        "top_k": options.top_k,
        "min_p": options.min_p,
        "seed": options.seed,
        "max_tokens": max_tokens,
        "stop": [s for s in stops if s],
        "repeat_penalty": request_options.repeat_penalty(options.repeat_penalty, "options.repeat_penalty"),
        "frequency_penalty": request_options.penalty(options.frequency_penalty, "options.frequency_penalty"),
        "presence_penalty": request_options.penalty(options.presence_penalty, "options.presence_penalty"),
        "context_tokens": options.num_ctx,
    }


CONTEXT_HEADER = "X-Skulk-Context-Tokens"
"""Response header saying the context a generation really had when `num_ctx` asked for
more than the placed instance holds (Ollama would reload the model larger; Skulk cannot)."""


def clamp_context(params: TextGenerationParams, instance_tokens: int) -> tuple[TextGenerationParams, int | None]:
    """`params` with `num_ctx` (its `context_tokens`) clamped to the instance's context, and
    the clamped value when clamping changed it (None otherwise), for the response to say."""
    asked = params.context_tokens
    if asked is None or asked <= instance_tokens:
        return params, None
    return params.model_copy(update={"context_tokens": instance_tokens}), instance_tokens


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's `keep_alive` as the runner's idle TTL from this request on
    (`skulk.shared.residency`): seconds, 0 to unload as soon as idle, -1 never; a
    value that is no duration is a 400 naming it."""
    try:
        return parse_keep_alive(value)
    except KeepAliveInvalid as exc:
        raise InvalidRequest(str(exc), param="keep_alive") from None


OPTION_PARAMS = {
    "response_format": "format", "repeat_penalty": "options.repeat_penalty", "thinking": "think",
    "reasoning_effort": "think",
    "frequency_penalty": "options.frequency_penalty", "presence_penalty": "options.presence_penalty",
}
"""Internal parameter names -> Ollama's, for errors about them."""


def _params(model: str, stream: bool, options: Options | None, format: Any = None, keep_alive: Any = None,
            **inputs: Any) -> TextGenerationParams:
    if not model.strip():
        raise InvalidRequest("model is required", param="model")
    keep_alive_s = keep_alive_seconds(keep_alive)
    response_format = request_options.ollama_format(format)
    try:
        return TextGenerationParams(model_id=ModelId(model), stream=stream, response_format=response_format,
                                    keep_alive_s=keep_alive_s, **_sampling(options), **inputs)
    except ValidationError as error:
        raise invalid_request_from_validation(error) from None


def _tools(tools: list[Tool]) -> list[ToolSpec]:
    specs: list[ToolSpec] = []
    for index, tool in enumerate(tools):
        if tool.type != "function":
            raise InvalidRequest(f"tools[{index}].type must be 'function', got {tool.type!r}",
                                 param=f"tools[{index}].type")
        specs.append(ToolSpec(name=tool.function.name, description=tool.function.description or "",
                              parameters=tool.function.parameters or {}))
    return specs


def _calls(message: Message, index: int) -> list[ToolCall]:
    calls: list[ToolCall] = []
    for number, call in enumerate(message.tool_calls or []):
        arguments = call.function.arguments
        text = arguments if isinstance(arguments, str) else json.dumps(arguments or {}, ensure_ascii=False)
        # Ollama's calls carry no ids; the template pairs them with results by position.
        calls.append(ToolCall(id=call.id or f"call_{index}_{number}", name=call.function.name, arguments=text))
    return calls


def _images(images: list[str] | None, param: str) -> list[ImageInput]:
    """Ollama's `images`: base64 strings (a `data:` URL is taken too), checked like every
    wire format's (`skulk.api.media`)."""
    checked: list[ImageInput] = []
    for index, image in enumerate(images or []):
        at = f"{param}[{index}]"
        data = media.parse_data_url(image, at) if image[:5].lower() == "data:" else media.decode_base64(image, at)
        checked.append(media.image_input(data, at))
    return checked


def _with_markers(text: str, count: int) -> str:
    """Ollama's images have no position in the text: they go first, as Ollama puts them."""
    return "\n".join([IMAGE_MARKER] * count + ([text] if text else [])) if count else text


def chat_params(request: ChatRequest) -> TextGenerationParams:
    messages: list[ChatMessage] = []
    for index, message in enumerate(request.messages):
        role = _ROLES.get(message.role)
        if role is None:
            raise InvalidRequest(f"invalid role {message.role!r} in messages[{index}]", param=f"messages[{index}].role")
        if message.images and role != "user":
            raise InvalidRequest(f"only user messages may carry images (messages[{index}])",
                                 param=f"messages[{index}].images")
        if message.tool_calls and role != "assistant":
            raise InvalidRequest(f"only assistant messages may carry tool_calls (messages[{index}])",
                                 param=f"messages[{index}].tool_calls")
        content = media.check_text(message.content, f"messages[{index}].content") or ""
        images = _images(message.images, f"messages[{index}].images")
        messages.append(ChatMessage(
            role=role, content=_with_markers(content, len(images)), images=images, tool_calls=_calls(message, index),
            name=message.tool_name if role == "tool" else None,
            reasoning_content=message.thinking if role == "assistant" else None,
        ))
    tools = _tools(request.tools or [])
    return _params(request.model, request.stream, request.options, request.format, request.keep_alive,
                   messages=messages, tools=tools, **request_options.reasoning_choice(request.think, "think",
                                                                                       booleans=True))


def embed_params(model: str, inputs: str | list[str], dimensions: int | None = None) -> EmbeddingParams:
    if not model.strip():
        raise InvalidRequest("model is required", param="model")
    items = [inputs] if isinstance(inputs, str) else list(inputs)
    if not items:
        raise InvalidRequest("input must not be empty", param="input")
    if any(not item for item in items):
        raise InvalidRequest("input must not contain empty strings", param="input")
    if dimensions is not None and dimensions < 1:
        raise InvalidRequest(f"dimensions must be at least 1, got {dimensions}", param="dimensions")
    try:
        return EmbeddingParams(model_id=ModelId(model), inputs=items, dimensions=dimensions)
    except ValidationError as error:
        raise invalid_request_from_validation(error) from None


def embed_response(model: str, vectors: list[list[float]], usage: Usage | None, timing: Timing) -> dict[str, Any]:
    durations = timing.durations()
    return {
        "model": model,
        "embeddings": vectors,
        "total_duration": durations["total_duration"],
        "load_duration": 0,
        "prompt_eval_count": usage.prompt_tokens if usage is not None else 0,
    }


def generate_params(request: GenerateRequest) -> TextGenerationParams:
    """A prompt becomes a user turn (with `system` before it), rendered by the model's chat
    template as Ollama does; `raw: true` sends the prompt as it is."""
    prompt = media.check_text(request.prompt, "prompt") or ""
    images = _images(request.images, "images")
    if request.raw:
        if images:
            raise InvalidRequest("images need the chat template: raw prompts cannot carry them", param="images")
        return _params(request.model, request.stream, request.options, request.format, request.keep_alive,
                       prompt=prompt)
    messages = [ChatMessage(role="system", content=media.check_text(request.system, "system"))] \
        if request.system else []
    messages.append(ChatMessage(role="user", content=_with_markers(prompt, len(images)), images=images))
    return _params(request.model, request.stream, request.options, request.format, request.keep_alive,
                   messages=messages, **request_options.reasoning_choice(request.think, "think", booleans=True))


# ---------------------------------------------------------------------------------------
# Response pieces
# ---------------------------------------------------------------------------------------


def timestamp(now: datetime | None = None) -> str:
    """RFC 3339 with nanosecond-style precision, as Ollama writes `created_at`."""
    return (now or datetime.now(UTC)).isoformat().replace("+00:00", "Z")


def ndjson(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False) + "\n"


def ndjson_error(error: ApiError) -> str:
    """How a stream that already answered 200 reports a failure: an `{"error"}` line, which
    the Ollama client raises as a `ResponseError`."""
    return ndjson(ollama_error_body(error))


def load_response(endpoint: Endpoint, model: str) -> dict[str, Any]:
    """Ollama's answer to a request with nothing to generate (an empty prompt or no
    messages): it only loads the model. A placed model is already loaded."""
    body: dict[str, Any] = {"model": model, "created_at": timestamp()}
    if endpoint == "chat":
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    return {**body, "done": True, "done_reason": "load"}


def _tool_call(call: ToolCall) -> dict[str, Any]:
    try:
        arguments: Any = json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        arguments = {"arguments": call.arguments}
    return {"function": {"name": call.name, "arguments": arguments}}


def done_reason(finish_reason: str | None) -> str:
    return "length" if finish_reason == "length" else "stop"


@dataclass(frozen=True)
class Timing:
    """Monotonic nanosecond marks of one request, taken by the route."""

    started_ns: int
    first_token_ns: int | None
    ended_ns: int

    def durations(self) -> dict[str, int]:
        first = self.first_token_ns if self.first_token_ns is not None else self.ended_ns
        return {
            "total_duration": self.ended_ns - self.started_ns,
            "load_duration": 0,
            "prompt_eval_duration": first - self.started_ns,
            "eval_duration": self.ended_ns - first,
        }


@dataclass
class OllamaEncoder:
    """Serialises one generation as Ollama objects for `endpoint` (chat: `message`,
    generate: `response`): `line()` per token chunk, then `final()`."""

    endpoint: Endpoint
    model: str
    _finish_reason: str | None = field(default=None, init=False)
    _usage: Usage | None = field(default=None, init=False)
    _count: int = field(default=0, init=False)

    def _body(self, text: str, thinking: str | None, *, done: bool,
              tool_calls: list[ToolCall] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "created_at": timestamp()}
        if self.endpoint == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if tool_calls:
                message["tool_calls"] = [_tool_call(call) for call in tool_calls]
            body["message"] = message
        else:
            body["response"] = text
            if thinking:
                body["thinking"] = thinking
        body["done"] = done
        return body

    def observe(self, chunk: TokenChunk) -> None:
        self._count += 1
        self._finish_reason = chunk.finish_reason or self._finish_reason
        self._usage = chunk.usage or self._usage

    def line(self, chunk: TokenChunk) -> str | None:
        self.observe(chunk)
        if not chunk.text and not chunk.tool_calls:
            return None
        text, thinking = ("", chunk.text) if chunk.reasoning else (chunk.text, None)
        return ndjson(self._body(text, thinking, done=False, tool_calls=chunk.tool_calls))

    def final(self, timing: Timing, text: str = "", thinking: str | None = None,
              tool_calls: list[ToolCall] | None = None) -> dict[str, Any]:
        body = self._body(text, thinking, done=True, tool_calls=tool_calls)
        body["done_reason"] = done_reason(self._finish_reason)
        body.update(timing.durations())
        usage = self._usage
        body["prompt_eval_count"] = usage.prompt_tokens if usage else 0
        body["eval_count"] = usage.completion_tokens if usage else self._count
        return body


def collect(encoder: OllamaEncoder, chunks: Iterable[TokenChunk], timing: Timing) -> dict[str, Any]:
    """The single non-streaming object for a completed stream's chunks."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for chunk in chunks:
        encoder.observe(chunk)
        (thoughts if chunk.reasoning else texts).append(chunk.text)
        calls.extend(chunk.tool_calls or [])
    return encoder.final(timing, "".join(texts), "".join(thoughts) or None, calls or None)


# ---------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------


def digest(model_id: str) -> str:
    """A stable stand-in for Ollama's blob digest (Skulk has no Ollama blobs)."""
    return hashlib.sha256(model_id.encode()).hexdigest()


def details(card: ModelCard | None) -> dict[str, Any]:
    if card is None:
        return {"parent_model": "", "format": "", "family": "", "families": None, "parameter_size": "",
                "quantization_level": ""}
    return {"parent_model": "", "format": card.artifact_format, "family": card.family, "families": [card.family],
            "parameter_size": parameter_size(card.total_parameters), "quantization_level": card.quantization}


def parameter_size(count: int | None) -> str:
    """Ollama's short form of a parameter count ('30.5B', '596.0M'); '' when unknown."""
    if count is None:
        return ""
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return str(count)


def _placed(instances: Iterable[Instance]) -> dict[ModelId, int]:
    """Placed model id -> the largest context any of its instances has."""
    limits: dict[ModelId, int] = {}
    for instance in instances:
        limits[instance.model_id] = max(limits.get(instance.model_id, 0), instance.context_token_limit)
    return limits


def tags(instances: Iterable[Instance], cards: Mapping[ModelId, ModelCard], modified_at: str) -> dict[str, Any]:
    """`/api/tags`: every placed model once, named by its model id."""
    models: list[dict[str, Any]] = []
    for model_id in sorted(_placed(instances)):
        card = cards.get(model_id)
        models.append({
            "name": model_id, "model": model_id, "modified_at": modified_at,
            "size": card.storage_size_bytes if card else 0, "digest": digest(model_id), "details": details(card),
        })
    return {"models": models}


def ps(instances: Iterable[Instance], cards: Mapping[ModelId, ModelCard], expires_at: str) -> dict[str, Any]:
    """`/api/ps`: the placed models with their context limit; they stay until deleted."""
    models: list[dict[str, Any]] = []
    for model_id, context_length in sorted(_placed(instances).items()):
        card = cards.get(model_id)
        size = card.storage_size_bytes if card else 0
        models.append({
            "name": model_id, "model": model_id, "size": size, "digest": digest(model_id), "details": details(card),
            "expires_at": expires_at, "size_vram": size, "context_length": context_length,
        })
    return {"models": models}


def show(model_id: str, card: ModelCard | None, context_length: int, modified_at: str) -> dict[str, Any]:
    """`/api/show` for a placed model."""
    info: dict[str, Any] = {"general.architecture": card.family if card else ""}
    # What Ollama's clients may offer: completion only for a model that generates text (a
    # speech card's model answers /v1/audio/* instead), embedding for an embedding model.
    capabilities = ["completion"] if card is None or "text" in card.capabilities else []
    if card is not None:
        capabilities += ["embedding"] if "embedding" in card.capabilities else []
        arch = card.family
        info.update({
            "general.basename": card.name,
            f"{arch}.block_count": card.num_layers,
            f"{arch}.embedding_length": card.hidden_size,
            f"{arch}.attention.head_count": card.num_attention_heads,
            f"{arch}.attention.head_count_kv": card.num_key_value_heads,
            f"{arch}.context_length": card.context_length,
        })
        if card.total_parameters is not None:
            info["general.parameter_count"] = card.total_parameters
        if card.num_experts is not None:
            info.update({f"{arch}.expert_count": card.num_experts, f"{arch}.expert_used_count": card.num_experts_used})
        capabilities += [c for c in ("tools", "thinking") if c in card.capabilities]
        if media.card_sees(card):  # the card says it sees and an engine of the card serves images
            capabilities.append("vision")
    return {
        "modelfile": f"FROM {model_id}\n", "parameters": f"num_ctx {context_length}", "template": "",
        "details": details(card), "model_info": info, "capabilities": capabilities, "modified_at": modified_at,
    }


__all__ = [
    "CONTEXT_HEADER",
    "OLLAMA_VERSION",
    "OPTION_PARAMS",
    "ChatRequest",
    "EmbedRequest",
    "GenerateRequest",
    "LegacyEmbeddingsRequest",
    "OllamaEncoder",
    "Options",
    "ShowRequest",
    "Timing",
    "chat_params",
    "clamp_context",
    "collect",
    "details",
    "digest",
    "done_reason",
    "embed_params",
    "embed_response",
    "generate_params",
    "keep_alive_seconds",
    "load_response",
    "ndjson",
    "ndjson_error",
    "ps",
    "show",
    "tags",
    "timestamp",
]
