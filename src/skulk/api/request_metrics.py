"""Counts every HTTP request by route template, method and status (`skulk_http_requests_total`)
and times it to the end of its body (`skulk_http_request_duration_seconds`).

Plain ASGI (not `BaseHTTPMiddleware`), so streaming responses and client-disconnect
detection pass through untouched. The route label is the matched route's template
(`/v1/traces/{trace_id}`), never the raw path; a request no route matched, or one refused
before routing (a missing API key), is labelled `unmatched`.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from skulk.observe.metrics import UNMATCHED_ROUTE, ServingMetrics


def route_label(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED_ROUTE


class RequestMetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServingMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception that escapes every handler is answered 500 by the server

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.observe_request(route_label(scope), scope.get("method", ""), status,
                                         time.perf_counter() - started)
