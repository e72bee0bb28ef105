"""Reading Ollama request bodies as JSON whatever their Content-Type says.

Ollama's server parses every body as JSON; its own curl examples send `-d '{...}'` without
a header (which curl labels `application/x-www-form-urlencoded`), and LiteLLM's
`ollama_chat/` provider sends none at all. FastAPI reads a body as JSON only when it is
labelled so, so on the `/ollama` routes this middleware labels it: a body that is not JSON
still fails, as a 400 naming the problem, exactly as a mislabelled one would.
"""

from __future__ import annotations

from typing import Any

OLLAMA_PREFIX = "/ollama"
JSON = b"application/json"


class OllamaJsonBodies:
    """ASGI middleware: under `/ollama`, a request with a body is labelled `application/json`."""

    def __init__(self, app: Any, prefix: str = OLLAMA_PREFIX) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "DELETE") and (
                scope["path"] == self.prefix or scope["path"].startswith(self.prefix + "/")):
            headers = [(name, value) for name, value in scope["headers"] if name != b"content-type"]
            labelled = next((value for name, value in scope["headers"] if name == b"content-type"), b"")
            if not labelled.lower().startswith(JSON):
                scope = {**scope, "headers": [*headers, (b"content-type", JSON)]}
        await self.app(scope, receive, send)


__all__ = ["OLLAMA_PREFIX", "OllamaJsonBodies"]
