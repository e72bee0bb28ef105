"""Typed API errors, and the one place that turns them into each caller's wire shape.

Routes and adapters raise `ApiError` subclasses that carry what they need to explain
themselves (the parameter at fault, the model to place, the runner's own error type); the
exception handlers installed by `install_error_handlers` choose the caller's wire format from
the request path and render the error there. Today that is the OpenAI shape
`{"error": {"message", "type", "param", "code"}}` for the OpenAI-compatible routes,
Anthropic's `{"type": "error", "error": {"type", "message"}}` for `/v1/messages`, Ollama's
`{"error": "..."}` under `/ollama/`, and FastAPI's own shapes everywhere else.

This module must never decide *whether* something is an error: it only says how one looks.
Bad input is always a 4xx here; a 500 is reserved for failures on our side.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from skulk.shared.types.stream_errors import StreamErrorType

logger = logging.getLogger(__name__)

ErrorKind = Literal[
    "invalid_request", "not_found", "overloaded", "unavailable", "timeout", "upstream", "internal", "cancelled",
    "forbidden", "conflict", "too_large",
]
"""What went wrong, independent of any wire format; each shape maps a kind to its status."""

StreamOrigin = Literal["runner", "api", "client"]
"""Who ended a command stream: the runner's own terminal frame, a decision of this API node
(deadline, protocol violation, failover, task failure), or a caller of this API (the client
went away or asked to cancel); whoever ended it has already told the cluster."""


class ApiError(Exception):
    """A failure the caller should see, typed. Subclasses fix `kind` (and a default `code`)."""

    kind: ErrorKind = "internal"
    default_code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code


class InvalidRequest(ApiError):
    """The request itself is wrong: `param` names the field to fix (`messages[0].content`)."""

    kind = "invalid_request"


class FeatureUnsupported(InvalidRequest):
    """The request asks for a feature the engine serving its model does not honour (see
    `skulk.shared.types.engines`): refused rather than silently ignored."""

    default_code = "unsupported_feature"

    def __init__(self, feature: str, engine: str, model_id: str, *, param: str | None = None) -> None:
        super().__init__(
            f"{model_id} is served by the {engine} engine, which does not support {feature}"
            f"{f' (requested by {param!r})' if param else ''}.",
            param=param,
        )
        self.feature, self.engine = feature, engine


class ImageRefused(InvalidRequest):
    """An image the request carries cannot be taken: too large, not PNG/JPEG/WebP/GIF, an
    undecodable header or `data:` URL, a URL this node does not fetch or could not fetch, a
    literal image marker in text, an unserved `detail`. `code` says which (docs/VISION.md),
    `param` names the field."""

    default_code = "invalid_image"


class ModelCannotSee(InvalidRequest):
    """The request carries images and the model's card does not say it sees (capability
    "vision"); the engine's half is `FeatureUnsupported` for "images"."""

    default_code = "model_cannot_see"

    def __init__(self, model_id: str, *, param: str | None = None) -> None:
        super().__init__(f"{model_id} does not accept images (its model card has no 'vision' capability); send "
                         "text only, or use a vision model.", param=param)
        self.model_id = model_id


class NotFound(ApiError):
    kind = "not_found"


class PayloadTooLarge(ApiError):
    """The request body is over the node's limit (`skulk.api.limits`): a 413."""

    kind = "too_large"
    default_code = "request_too_large"


class ModelNotFound(NotFound):
    """No instance of the model is placed; chat requests never place one implicitly."""

    default_code = "model_not_found"

    def __init__(self, model_id: str) -> None:
        super().__init__(
            f"The model {model_id!r} has no placed instance in this cluster. "
            f'Place it first: POST /place_instance {{"modelId": "{model_id}"}}',
            param="model",
        )
        self.model_id = model_id


class Forbidden(ApiError):
    """The caller may not do this here (a path outside the allowed directories, say)."""

    kind = "forbidden"


class Conflict(ApiError):
    """The request would replace something that exists; an explicit override is needed."""

    kind = "conflict"


class ModelNotServing(ApiError):
    """The model is placed, but no instance serves or is coming up: every one has a runner
    down. Refused at once (503) instead of waiting for a first frame that never comes; the
    message names each runner's node, state and reason."""

    kind = "unavailable"
    default_code = "model_not_serving"

    def __init__(self, model_id: str, message: str) -> None:
        super().__init__(message, param="model")
        self.model_id = model_id


class Overloaded(ApiError):
    """A bound on concurrent work is reached; retrying a little later is the fix."""

    kind = "overloaded"
    default_code = "overloaded"


class ClusterNotReady(ApiError):
    """No master to take the command (still electing, or unreachable)."""

    kind = "unavailable"
    default_code = "cluster_not_ready"


class PeerUnreachable(ApiError):
    """Another node's API did not answer this node's request (down, partitioned, or past the
    deadline): `node_id` names it."""

    kind = "upstream"
    default_code = "peer_unreachable"

    def __init__(self, node_id: str, reason: str) -> None:
        super().__init__(f"Node {node_id} did not answer: {reason}")
        self.node_id = node_id


class ExtensionFailed(ApiError):
    """An installed extension whose `failure_policy` is "fail" could not transform this
    request (it raised, overran its deadline or returned unusable params): the request is
    refused rather than served without the policy the extension enforces. 502, naming it."""

    kind = "upstream"
    default_code = "extension_failed"

    def __init__(self, extension: str, reason: str) -> None:
        super().__init__(f"Extension {extension!r} failed on this request: {reason}")
        self.extension = extension


STREAM_ERROR_KINDS: dict[str, ErrorKind] = {
    StreamErrorType.CANCELLED: "cancelled",
    StreamErrorType.CLIENT_CLOSED: "cancelled",
    StreamErrorType.IDLE_TIMEOUT: "timeout",
    StreamErrorType.FIRST_FRAME_TIMEOUT: "timeout",
    StreamErrorType.MASTER_FAILOVER: "unavailable",
    StreamErrorType.INPUT_TOO_LARGE: "too_large",  # the request's input over the transfer bound
    StreamErrorType.INPUT_TRANSFER_LOST: "unavailable",  # nothing ran: try again
    StreamErrorType.INPUT_TRANSFER_FAILED: "upstream",
    # The master failed the task: its instance is gone, lost a node, was refused or never
    # placed. The type says which; all are "try again", none is the request's fault.
    StreamErrorType.TASK_FAILED: "unavailable",
    StreamErrorType.INSTANCE_GONE: "unavailable",
    StreamErrorType.NODE_LOST: "unavailable",
    StreamErrorType.PLACEMENT_REFUSED: "unavailable",
    StreamErrorType.DOWNLOAD_FAILED: "unavailable",
    StreamErrorType.GROUP_BROKEN: "unavailable",
    StreamErrorType.CLIENT_TOO_SLOW: "overloaded",
    StreamErrorType.POOL_MEMBER_LOST: "unavailable",  # a llama.cpp pool lost a donor: the instance is being re-placed
    StreamErrorType.PROTOCOL_VIOLATION: "upstream",
    StreamErrorType.TOOL_CALL_INVALID: "upstream",  # the model broke a strict tool's schema
    StreamErrorType.TERMINAL_LOST: "upstream",  # the runner finished; its last frame was lost on the way
    # Runner errors that are the request's fault, reported before any output went out
    # (embeddings answer only once everything is computed): the caller gets a 4xx.
    StreamErrorType.CONTEXT_LENGTH_EXCEEDED: "invalid_request",
    StreamErrorType.INVALID_REQUEST: "invalid_request",
}
"""Kinds of the stream error types this API produces itself; a runner's own error types (an
engine crash, an out-of-memory) are `internal` unless listed here."""


STREAM_ERROR_CODES: dict[str, str] = {
    StreamErrorType.CONTEXT_LENGTH_EXCEEDED: "context_length_exceeded",
}
"""Runner error types whose error `code` a client matches on, as OpenAI spells it (LiteLLM
maps `context_length_exceeded` to its ContextWindowExceededError); others keep their type."""


class StreamFailed(ApiError):
    """A command's output stream ended without completing: the runner reported a failure or a
    cancellation, or this API ended it (see `StreamOrigin`). `code` is the error type."""

    def __init__(
        self,
        error_type: StreamErrorType | str,
        message: str,
        *,
        outcome: Literal["failed", "cancelled"] = "failed",
        origin: StreamOrigin = "runner",
    ) -> None:
        super().__init__(message, code=STREAM_ERROR_CODES.get(error_type, error_type))
        self.error_type = error_type
        self.outcome = outcome
        self.origin = origin
        self.kind = "cancelled" if outcome == "cancelled" else STREAM_ERROR_KINDS.get(error_type, "internal")


# ---------------------------------------------------------------------------------------
# The OpenAI shape
# ---------------------------------------------------------------------------------------

OPENAI_STATUS: dict[ErrorKind, tuple[int, str]] = {
    "invalid_request": (400, "invalid_request_error"),
    "not_found": (404, "invalid_request_error"),
    "overloaded": (503, "server_error"),
    "unavailable": (503, "server_error"),
    "timeout": (504, "server_error"),
    "upstream": (502, "server_error"),
    "internal": (500, "server_error"),
    # Not a 5xx: the OpenAI SDK retries those on its own, and a cancelled request must stay
    # cancelled. 499 is the conventional "client closed request" status.
    "cancelled": (499, "request_cancelled"),
    "forbidden": (403, "permission_error"),
    "conflict": (409, "invalid_request_error"),
    "too_large": (413, "invalid_request_error"),
}
"""Kind -> (HTTP status, OpenAI error `type`)."""

RETRY_AFTER_S = 1
"""`Retry-After` sent with an overloaded or not-ready answer: capacity frees per request."""


def openai_error_body(error: ApiError) -> dict[str, Any]:
    _, error_type = OPENAI_STATUS[error.kind]
    return {"error": {"message": error.message, "type": error_type, "param": error.param, "code": error.code}}


def openai_error_status(error: ApiError) -> int:
    return OPENAI_STATUS[error.kind][0]


def openai_error_response(error: ApiError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if error.kind in ("overloaded", "unavailable") else None
    return JSONResponse(openai_error_body(error), status_code=openai_error_status(error), headers=headers)


# ---------------------------------------------------------------------------------------
# The Anthropic and Ollama shapes
# ---------------------------------------------------------------------------------------

ANTHROPIC_STATUS: dict[ErrorKind, tuple[int, str]] = {
    "invalid_request": (400, "invalid_request_error"),
    "not_found": (404, "not_found_error"),
    # 529 is Anthropic's own "overloaded" status; its SDK retries it, as it should here.
    "overloaded": (529, "overloaded_error"),
    "unavailable": (503, "api_error"),
    "timeout": (504, "api_error"),
    "upstream": (502, "api_error"),
    "internal": (500, "api_error"),
    "cancelled": (499, "api_error"),
    "forbidden": (403, "permission_error"),
    "conflict": (409, "invalid_request_error"),
    "too_large": (413, "request_too_large"),
}
"""Kind -> (HTTP status, Anthropic error `type`)."""


def anthropic_error_body(error: ApiError) -> dict[str, Any]:
    _, error_type = ANTHROPIC_STATUS[error.kind]
    return {"type": "error", "error": {"type": error_type, "message": error.message}}


def anthropic_error_response(error: ApiError, status: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if error.kind in ("overloaded", "unavailable") else None
    return JSONResponse(anthropic_error_body(error), status_code=status or ANTHROPIC_STATUS[error.kind][0],
                        headers=headers)


def ollama_error_body(error: ApiError) -> dict[str, Any]:
    return {"error": error.message}


def ollama_error_response(error: ApiError, status: int | None = None) -> JSONResponse:
    """Ollama answers `{"error": "..."}` with the HTTP status carrying the kind."""
    headers = {"Retry-After": str(RETRY_AFTER_S)} if error.kind in ("overloaded", "unavailable") else None
    return JSONResponse(ollama_error_body(error), status_code=status or OPENAI_STATUS[error.kind][0], headers=headers)


def native_error_response(error: ApiError) -> JSONResponse:
    """Skulk-native routes: FastAPI's `detail` convention plus the typed fields (camelCase)."""
    status, _ = OPENAI_STATUS[error.kind]
    return JSONResponse(
        {"detail": error.message, "errorKind": error.kind, "param": error.param, "code": error.code}, status_code=status
    )


# ---------------------------------------------------------------------------------------
# Which caller speaks which shape
# ---------------------------------------------------------------------------------------

WireShape = Literal["openai", "anthropic", "ollama", "native"]

NATIVE_V1_PREFIXES: tuple[str, ...] = (
    "/v1/cluster", "/v1/diagnostics", "/v1/tracing", "/v1/traces", "/v1/capabilities", "/v1/events",
    "/v1/telemetry",
)
"""Skulk's own routes that happen to live under /v1: they keep FastAPI's shapes."""

_SHAPES: tuple[tuple[str, WireShape], ...] = (
    ("/v1/", "openai"),
    ("/v1/messages", "anthropic"),
    ("/ollama", "ollama"),
    ("/ollama/v1/", "openai"),  # Ollama's OpenAI-compatible paths answer as OpenAI does
    # The model store's routes answer in the OpenAI shape (`{"error": {...code}}`), which is
    # what `skulk models pull` and the store fetcher on other nodes parse.
    ("/store/", "openai"),
)
"""Path prefix -> wire shape; longest matching prefix wins."""


def wire_shape_for(path: str) -> WireShape:
    if path.startswith(NATIVE_V1_PREFIXES):
        return "native"
    best: tuple[int, WireShape] = (-1, "native")
    for prefix, shape in _SHAPES:
        if path.startswith(prefix) and len(prefix) > best[0]:
            best = (len(prefix), shape)
    return best[1]


def render(request: Request, error: ApiError, status: int | None = None) -> JSONResponse:
    """`error` in the wire shape of the caller of `request` (`status` overrides the kind's)."""
    shape = wire_shape_for(request.url.path)
    if shape == "anthropic":
        return anthropic_error_response(error, status)
    if shape == "ollama":
        return ollama_error_response(error, status)
    if shape == "openai":
        return openai_error_response(error)
    return native_error_response(error)


def _route_error(request: Request, status: int, detail: Any) -> ApiError:
    """A Starlette HTTP error (no route, wrong method, a route's own HTTPException) as a
    typed error, for the compatibility shapes."""
    method, path = request.method, request.url.path
    if status == 404 and "endpoint" not in request.scope:
        return NotFound(f"Unknown request URL: {method} {path}. Please check the URL for typos.", code="unknown_url")
    if status == 405:
        return InvalidRequest(f"Method {method} is not allowed for {path}.", code="method_not_allowed")
    if status == 404:
        return NotFound(str(detail))
    return ApiError(str(detail)) if status >= 500 else InvalidRequest(str(detail))


# ---------------------------------------------------------------------------------------
# Pydantic errors -> a parameter name and a message
# ---------------------------------------------------------------------------------------

_UNION_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none", "json-or-python"})


def _is_union_tag(segment: str) -> bool:
    # pydantic names each union member it tried ('str', 'list[ContentPart]',
    # 'function-after[...]'); callers want the field, not our type names.
    return segment in _UNION_TAGS or "[" in segment or "-" in segment


def param_from_loc(loc: Sequence[int | str]) -> str | None:
    """('body', 'messages', 0, 'content', 'str') -> 'messages[0].content'."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    text = ""
    for segment in parts:
        if isinstance(segment, int):
            text += f"[{segment}]"
        elif not _is_union_tag(segment):
            text += f".{segment}" if text else segment
    return text or None


def invalid_request_from_errors(errors: Sequence[Any]) -> InvalidRequest:
    """The first of pydantic's (or FastAPI's) errors as an `InvalidRequest` naming its param."""
    if not errors:
        return InvalidRequest("The request body is invalid.")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return InvalidRequest(
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
            "your HTTP library correctly. The body must be a JSON object.)" + (f" Parser said: {detail}" if detail else ""),
            code="invalid_json",
        )
    param = param_from_loc(first.get("loc", ()))
    if param is None and first.get("type") in ("missing", "model_attributes_type", "dict_type", "model_type"):
        return InvalidRequest(
            "The request body must be a JSON object, sent with 'Content-Type: application/json'.", code="invalid_json"
        )
    if first.get("type") == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    if param is None:
        return InvalidRequest(f"The request body is invalid: {first.get('msg', '')}.")
    return InvalidRequest(f"Invalid value for '{param}': {first.get('msg', '')}.", param=param, code="invalid_value")


def invalid_request_from_validation(error: ValidationError) -> InvalidRequest:
    return invalid_request_from_errors(error.errors(include_url=False))


# ---------------------------------------------------------------------------------------
# Handlers
# ---------------------------------------------------------------------------------------


async def _api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return render(request, exc)


async def _validation_handler(request: Request, exc: Exception) -> Any:
    assert isinstance(exc, RequestValidationError)
    if wire_shape_for(request.url.path) in ("anthropic", "ollama"):
        return render(request, invalid_request_from_errors(exc.errors()))
    if wire_shape_for(request.url.path) != "openai":
        return await request_validation_exception_handler(request, exc)
    return openai_error_response(invalid_request_from_errors(exc.errors()))


async def _http_exception_handler(request: Request, exc: Exception) -> Any:
    assert isinstance(exc, StarletteHTTPException)
    if wire_shape_for(request.url.path) in ("anthropic", "ollama"):
        response = render(request, _route_error(request, exc.status_code, exc.detail), exc.status_code)
        response.headers.update(getattr(exc, "headers", None) or {})
        return response
    if wire_shape_for(request.url.path) != "openai":
        return await http_exception_handler(request, exc)
    method, path = request.method, request.url.path
    if exc.status_code == 404 and "endpoint" not in request.scope:
        # No route matched at all (as opposed to a route answering 404).
        body = {"message": f"Unknown request URL: {method} {path}. Please check the URL for typos.",
                "type": "invalid_request_error", "param": None, "code": "unknown_url"}
    elif exc.status_code == 405:
        body = {"message": f"Method {method} is not allowed for {path}.",
                "type": "invalid_request_error", "param": None, "code": "method_not_allowed"}
    else:
        body = {"message": str(exc.detail), "type": "server_error" if exc.status_code >= 500 else "invalid_request_error",
                "param": None, "code": None}
    return JSONResponse({"error": body}, status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _unhandled_handler(request: Request, exc: Exception) -> Any:
    # Starlette re-raises the exception after this response is sent, so it is still logged.
    if wire_shape_for(request.url.path) in ("anthropic", "ollama"):
        return render(request, ApiError(f"Internal error: {type(exc).__name__}"))
    if wire_shape_for(request.url.path) != "openai":
        return PlainTextResponse("Internal Server Error", status_code=500)
    body = {"message": f"Internal error: {type(exc).__name__}", "type": "server_error", "param": None, "code": None}
    return JSONResponse({"error": body}, status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    """Typed errors everywhere; the caller's shape (OpenAI, Anthropic, Ollama) for malformed JSON, schema violations (a 400,
    never FastAPI's 422), unknown routes and unmatched methods on the OpenAI routes."""
    app.add_exception_handler(ApiError, _api_error_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_exception_handler)
    app.add_exception_handler(Exception, _unhandled_handler)


__all__ = [
    "ANTHROPIC_STATUS",
    "NATIVE_V1_PREFIXES",
    "OPENAI_STATUS",
    "RETRY_AFTER_S",
    "STREAM_ERROR_KINDS",
    "ApiError",
    "ClusterNotReady",
    "ErrorKind",
    "FeatureUnsupported",
    "ImageRefused",
    "InvalidRequest",
    "ModelCannotSee",
    "ModelNotFound",
    "ModelNotServing",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "StreamFailed",
    "StreamOrigin",
    "WireShape",
    "anthropic_error_body",
    "anthropic_error_response",
    "install_error_handlers",
    "invalid_request_from_errors",
    "invalid_request_from_validation",
    "ollama_error_body",
    "ollama_error_response",
    "openai_error_body",
    "openai_error_response",
    "openai_error_status",
    "param_from_loc",
    "render",
    "wire_shape_for",
]
