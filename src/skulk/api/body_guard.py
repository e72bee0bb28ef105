"""ASGI middleware that bounds and vets every request body before any route parses it.

Without it a 50 MB body was read, parsed and validated in full (25 s, ~4 GB of memory)
before anything refused it, and a lone UTF-16 surrogate in any JSON string reached the
command framing (a 503) or a file path (a 500 and a reset connection).

Order of checks, each answered in the caller's wire shape (`skulk.api.errors.render`):
1. a declared Content-Length over the limit: 413 at once, no byte read;
2. the body as it streams in, with a running count: 413 as soon as it passes the limit
   (chunked uploads have no Content-Length);
3. a JSON body holding invalid Unicode, a non-finite number or absurd nesting: 400.
Then the body is handed on to the app unchanged, and every later `receive` (the routes wait
on it for the client's disconnect) goes to the server as before.

Decisions live in `skulk.api.limits`; this shell only moves bytes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from starlette.requests import Request

from skulk.api.errors import ApiError, render
from skulk.api.limits import body_size_error, declared_length, json_value_error

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyGuard:
    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], *, max_body_bytes: int,
                 path_limits: Mapping[str, int] | None = None) -> None:
        """`path_limits`: routes (exact paths) with a body limit of their own, the audio
        uploads (`skulk.shared.body_limits.AUDIO_UPLOAD_PATHS`)."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = declared_length(headers.get(b"content-length"))
        if isinstance(declared, ApiError):
            await self._refuse(scope, receive, send, declared)
            return
        path = str(scope.get("path", ""))
        audio = path in self.path_limits
        limit = self.path_limits.get(path, self.max_body_bytes)
        early = body_size_error(declared, limit, audio=audio)
        if early is not None:
            await self._refuse(scope, receive, send, early)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            late = body_size_error(size, limit, audio=audio)
            if late is not None:
                await self._refuse(scope, receive, send, late)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        chunks.clear()
        if body and not audio:  # an upload is a multipart form, never JSON
            bad = json_value_error(body)
            if bad is not None:
                await self._refuse(scope, receive, send, bad)
                return
        await self.app(scope, _replay(body, receive), send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, error: ApiError) -> None:
        response = render(Request(scope), error)
        # The rest of an over-long body is never read: close the connection after answering.
        response.headers["Connection"] = "close"
        await response(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields the buffered body once, then defers to the server's."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


__all__ = ["BodyGuard"]
