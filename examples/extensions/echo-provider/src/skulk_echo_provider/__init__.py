"""A reference Skulk capability provider: one unary and one server-streaming capability.

Skulk finds `extension` through the `skulk.extensions` entry point (see pyproject.toml),
calls it once at node start, and registers every descriptor the providers describe. Skulk
owns the call's lifecycle: it checks inputs against `inputSchema` before a handler runs,
checks every result and chunk against `outputSchema`, enforces the deadline, and closes a
stream handler's iterator (running its `finally`) when the caller cancels.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

TEXT = {"type": "string", "maxLength": 4096}


class EchoProvider:
    def descriptors(self) -> list[dict[str, Any]]:
        return [
            {
                "id": "echo",
                "version": "1.0.0",
                "description": "Returns the text it is given, unchanged.",
                "ioMode": "unary",
                "inputSchema": {
                    "type": "object",
                    "properties": {"text": TEXT},
                    "required": ["text"],
                    "additionalProperties": False,
                },
                "outputSchema": {"type": "object", "properties": {"text": TEXT}, "required": ["text"]},
            },
            {
                "id": "echo.stream",
                "version": "1.0.0",
                "description": "Streams the text it is given back, `repeat` times, one chunk each.",
                "ioMode": "server_streaming",
                "inputSchema": {
                    "type": "object",
                    "properties": {"text": TEXT, "repeat": {"type": "integer", "minimum": 1, "maximum": 100}},
                    "required": ["text"],
                    "additionalProperties": False,
                },
                "outputSchema": {
                    "type": "object",
                    "properties": {"index": {"type": "integer"}, "text": TEXT},
                    "required": ["index", "text"],
                },
            },
        ]

    async def handle_call(self, capability_id: str, payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"text": payload["text"]}

    async def handle_stream(
        self, capability_id: str, payload: dict[str, Any], inputs: Any, ctx: Any
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            for index in range(payload.get("repeat", 1)):
                yield {"index": index, "text": payload["text"]}
                await asyncio.sleep(0)  # a real provider awaits its work here
        finally:
            pass  # release what the call held: Skulk sends the terminal only after this ran


class EchoExtension:
    name = "echo-provider"
    version = "0.1.0"
    skulk_versions = ">=0.1"

    def providers(self) -> list[Any]:
        return [EchoProvider()]


def extension() -> EchoExtension:
    return EchoExtension()
