"""The HTTP side of the cluster client: one `httpx.Client` against one node, the API key as
a Bearer token, every non-2xx answer raised as the API's own typed error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
from httpx_sse import connect_sse

from skulk.client.views import ChatDelta, ClientError, chat_delta, error_from_response

DEFAULT_URL = "http://localhost:52415"
URL_ENV = "SKULK_URL"

REQUEST_TIMEOUT_S = 30.0
"""Control calls (state, placement, search) answer within this; hub searches are the slowest."""

ADD_TIMEOUT_S = 120.0
"""`POST /models/add` reads repository metadata from the hub before it answers."""

STREAM_READ_TIMEOUT_S = 300.0
"""Longest silence inside a chat stream before the client gives up (a cold model load)."""


class NodeClient:
    def __init__(self, url: str, api_key: str | None) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=REQUEST_TIMEOUT_S)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, timeout_s: float | None = None, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, timeout=timeout_s or REQUEST_TIMEOUT_S, **kwargs)
        except httpx.TransportError as exc:
            raise ClientError(0, "unreachable", f"cannot reach a Skulk node at {self.url} ({exc}); "
                                                f"start one with `skulk run` or pass --url") from None
        if response.status_code >= 400:
            raise error_from_response(response.status_code, response.text)
        return response.json()

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: dict[str, Any], **kwargs: Any) -> Any:
        return self.request("POST", path, json=body, **kwargs)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def stream_chat(self, body: dict[str, Any]) -> Iterator[ChatDelta]:
        """Stream `POST /v1/chat/completions`; a refusal before the stream raises its error,
        an error inside the stream is yielded as a delta carrying it."""
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
        try:
            with connect_sse(self._http, "POST", "/v1/chat/completions", json={**body, "stream": True},
                             timeout=timeout) as source:
                if source.response.status_code >= 400:
                    source.response.read()
                    raise error_from_response(source.response.status_code, source.response.text)
                for sse in source.iter_sse():
                    delta = chat_delta(sse.data)
                    if delta is not None:
                        yield delta
        except httpx.TransportError as exc:
            raise ClientError(0, "unreachable", f"the stream from {self.url} broke: {exc}") from None
