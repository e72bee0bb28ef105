"""Optional API keys: when the node has one (`ApiContext.api_key`, from `SKULK_API_KEY`),
every request must present it, except the dashboard's static assets (`/` and `/static/...`).

Callers present it the way their SDK does: `Authorization: Bearer <key>` (OpenAI, Ollama,
Skulk's own routes) or, on Anthropic's `/v1/messages`, `x-api-key: <key>` (Bearer is taken
there too). A refusal is a 401 in the caller's wire shape (chosen by path, as every other
error is: `skulk.api.errors.wire_shape_for`). Keys are compared in constant time.

`ApiKeyMiddleware` is plain ASGI (not `BaseHTTPMiddleware`), so streaming responses and
client-disconnect detection pass through it untouched.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from skulk.api.errors import wire_shape_for

API_KEY_ENV = "SKULK_API_KEY"
"""The environment variable the node reads the key from (an empty value means no key)."""

OPEN_PATH_PREFIXES: tuple[str, ...] = ("/static/",)
OPEN_PATHS: frozenset[str] = frozenset({"/", "/static"})
"""Dashboard assets, served without a key (the dashboard itself then calls the API with one)."""

MISSING_MESSAGE = ("This node requires an API key. Send it as 'Authorization: Bearer <key>' "
                   "(or 'x-api-key: <key>' on /v1/messages).")
WRONG_MESSAGE = "Incorrect API key provided."


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def presented_keys(headers: Mapping[str, str], *, accept_x_api_key: bool = True) -> list[str]:
    """The keys a request presents: the Bearer token and (where accepted) `x-api-key`."""
    lowered = {name.lower(): value for name, value in headers.items()}
    keys = []
    scheme, _, token = lowered.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        keys.append(token.strip())
    if accept_x_api_key and lowered.get("x-api-key", "").strip():
        keys.append(lowered["x-api-key"].strip())
    return keys


def check_api_key(headers: Mapping[str, str], expected: str | None, *, accept_x_api_key: bool = True) -> bool:
    """True when no key is required (`expected` empty or None) or `headers` present it."""
    if not expected:
        return True
    # Every presented key is compared (no early exit), each in constant time.
    results = [_same(key, expected) for key in presented_keys(headers, accept_x_api_key=accept_x_api_key)]
    return any(results)


def is_open_path(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PATH_PREFIXES)


def unauthorized_response(path: str, missing: bool) -> JSONResponse:
    """The 401 in the wire shape of the caller of `path`."""
    message = MISSING_MESSAGE if missing else WRONG_MESSAGE
    shape = wire_shape_for(path)
    body: dict[str, Any]
    if shape == "openai":
        body = {"error": {"message": message, "type": "invalid_request_error", "param": None,
                          "code": "invalid_api_key"}}
    elif shape == "anthropic":
        body = {"type": "error", "error": {"type": "authentication_error", "message": message}}
    elif shape == "ollama":
        body = {"error": message}
    else:
        body = {"error": {"code": "invalid_api_key", "message": message}}
    return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})


class ApiKeyMiddleware:
    """Refuses every request without the key (see the module docstring)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or is_open_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path = scope["path"]
        accept_x_api_key = wire_shape_for(path) == "anthropic"
        if check_api_key(headers, self.api_key, accept_x_api_key=accept_x_api_key):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        missing = not presented_keys(headers, accept_x_api_key=accept_x_api_key)
        await unauthorized_response(path, missing)(scope, receive, send)


__all__ = [
    "API_KEY_ENV",
    "ApiKeyMiddleware",
    "OPEN_PATHS",
    "OPEN_PATH_PREFIXES",
    "check_api_key",
    "is_open_path",
    "presented_keys",
    "unauthorized_response",
]
