"""API keys and the node's access policy, applied to every request.

The decisions are pure and live in `skulk.api.access` (who may call which route, the `Host`
check, loopback without a key, operator vs inference keys, the peer token). This module is
the ASGI shell: `AccessMiddleware` applies a decision, records the caller's `Principal` for
the request (`current_principal`, read where a request's ownership matters: cancelling it),
and renders refusals in the caller's wire shape (chosen by path, as every other error is:
`skulk.api.errors.wire_shape_for`).

Callers present keys the way their SDK does: `Authorization: Bearer <key>` (OpenAI, Ollama,
Skulk's own routes) or, on Anthropic's `/v1/messages`, `x-api-key: <key>` (Bearer is taken
there too). Keys are compared in constant time.

`AccessMiddleware` is plain ASGI (not `BaseHTTPMiddleware`), so streaming responses and
client-disconnect detection pass through it untouched.
"""

from __future__ import annotations

import contextvars
import hmac
from collections.abc import Mapping
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from skulk.api.access import (
    ANONYMOUS,
    OPEN_PATH_PREFIXES,
    OPEN_PATHS,
    AccessPolicy,
    Allowed,
    Principal,
    decide,
    presented_keys,
)
from skulk.api.errors import wire_shape_for

API_KEY_ENV = "SKULK_API_KEY"
"""The environment variable the node reads the key from (an empty value means: use the
configured key, else the one in the data dir)."""

_principal: contextvars.ContextVar[Principal] = contextvars.ContextVar("skulk_principal", default=ANONYMOUS)


def current_principal() -> Principal:
    """Who made the request being handled (set by `AccessMiddleware`; ANONYMOUS without one)."""
    return _principal.get()


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def check_api_key(headers: Mapping[str, str], expected: str | None, *, accept_x_api_key: bool = True) -> bool:
    """True when no key is required (`expected` empty or None) or `headers` present it."""
    if not expected:
        return True
    # Every presented key is compared (no early exit), each in constant time.
    results = [_same(key, expected) for key in presented_keys(headers, accept_x_api_key=accept_x_api_key)]
    return any(results)


def is_open_path(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PATH_PREFIXES)


def refusal_response(path: str, status: int, code: str, message: str) -> JSONResponse:
    """A refusal of the access policy in the wire shape of the caller of `path`."""
    shape = wire_shape_for(path)
    body: dict[str, Any]
    if shape == "openai":
        error_type = "invalid_request_error" if status == 401 else "permission_error"
        body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    elif shape == "anthropic":
        body = {"type": "error", "error": {
            "type": "authentication_error" if status == 401 else "permission_error", "message": message}}
    elif shape == "ollama":
        body = {"error": message}
    else:
        body = {"detail": message, "error": {"code": code, "message": message}}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


class AccessMiddleware:
    """Applies the node's `AccessPolicy` to every request (see the module docstring)."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        client = scope.get("client")
        decision = decide(
            self.policy, method=scope.get("method", "GET"), path=path,
            client_host=client[0] if client else None, headers=Headers(scope=scope),
            accept_x_api_key=wire_shape_for(path) == "anthropic",
        )
        if isinstance(decision, Allowed):
            token = _principal.set(decision.principal)
            try:
                await self.app(scope, receive, send)
            finally:
                _principal.reset(token)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await refusal_response(path, decision.status, decision.code, decision.message)(scope, receive, send)


__all__ = [
    "API_KEY_ENV",
    "OPEN_PATHS",
    "OPEN_PATH_PREFIXES",
    "AccessMiddleware",
    "check_api_key",
    "current_principal",
    "is_open_path",
    "presented_keys",
    "refusal_response",
]
