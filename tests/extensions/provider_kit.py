"""A test provider extension: one capability per behaviour the provider tests need.

Imported in-process by the unit tests and, copied into a temporary dir with a `*.dist-info`
holding its entry point, loaded by a real node process (`tests/cluster/test_providers.py`).
When `SKULK_TEST_PROVIDER_MARKERS` names a dir, a handler whose `finally` ran writes a file
there named after its capability: the proof, from outside the node, that its iterator was
closed. Self-contained on purpose (only the standard library): a node imports it by path.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

MARKERS_ENV = "SKULK_TEST_PROVIDER_MARKERS"
closed: list[str] = []
"""Capabilities whose handler's `finally` ran, in order (in-process tests read it)."""

TEXT = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}
INDEX = {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]}
COUNT_INPUT = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["n"],
}


def _descriptor(cid: str, mode: str, input_schema: dict[str, Any], output_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "version": "1.0.0",
        "description": f"test capability {cid}",
        "ioMode": mode,
        "inputSchema": input_schema,
        "outputSchema": output_schema,
    }


def _mark(name: str) -> None:
    closed.append(name)
    markers = os.environ.get(MARKERS_ENV)
    if markers:
        Path(markers, name).write_text("closed\n")


class KitProvider:
    def descriptors(self) -> list[dict[str, Any]]:
        return [
            _descriptor("echo", "unary", TEXT, TEXT),
            _descriptor("bad-output", "unary", TEXT, TEXT),
            _descriptor("hang", "unary", TEXT, TEXT),
            _descriptor("boom", "unary", TEXT, TEXT),
            _descriptor("closed", "unary", TEXT, TEXT),
            _descriptor("count", "server_streaming", COUNT_INPUT, INDEX),
            _descriptor("wait-stream", "server_streaming", COUNT_INPUT, INDEX),
            _descriptor("malformed", "server_streaming", COUNT_INPUT, INDEX),
            _descriptor("slow-close", "server_streaming", COUNT_INPUT, INDEX),
            _descriptor("sum", "client_streaming", COUNT_INPUT, {"type": "object", "required": ["total"]}),
            _descriptor("upper", "bidi_streaming", TEXT, TEXT),
        ]

    def admit(self, capability_id: str, ctx: Any) -> str | None:
        return "the mounted model is gone" if capability_id == "closed" else None

    async def handle_call(self, capability_id: str, payload: Any, ctx: Any) -> Any:
        if capability_id == "echo":
            return {"text": payload["text"]}
        if capability_id == "bad-output":
            return {"text": 42}
        if capability_id == "boom":
            raise RuntimeError("provider bug " + "x" * 5000)
        await asyncio.Event().wait()  # hang: an event that never comes
        return None

    def handle_stream(self, capability_id: str, payload: Any, inputs: Any, ctx: Any) -> Any:
        return getattr(self, "_" + capability_id.replace("-", "_"))(payload, inputs)

    async def _count(self, payload: Any, inputs: Any) -> Any:
        try:
            for i in range(payload["n"]):
                yield {"i": i}
        finally:
            _mark("count")

    async def _wait_stream(self, payload: Any, inputs: Any) -> Any:
        try:
            yield {"i": 0}
            await asyncio.Event().wait()
        finally:
            _mark("wait-stream")

    async def _malformed(self, payload: Any, inputs: Any) -> Any:
        try:
            yield {"i": 0}
            yield {"i": object()}  # not JSON
            yield {"i": 2}  # never reached: the iterator is closed first
        finally:
            _mark("malformed")

    async def _slow_close(self, payload: Any, inputs: Any) -> Any:
        try:
            yield {"i": 0}
        finally:
            await asyncio.sleep(0.2)
            _mark("slow-close")

    async def _sum(self, payload: Any, inputs: Any) -> Any:
        total = 0
        async for chunk in inputs:
            total += chunk["n"]
        yield {"total": total}

    async def _upper(self, payload: Any, inputs: Any) -> Any:
        async for chunk in inputs:
            yield {"text": chunk["text"].upper()}
        yield {"text": "<done>"}


class KitExtension:
    name = "provider-kit"
    version = "1.0.0"
    skulk_versions = ">=0"

    def providers(self) -> list[Any]:
        return [KitProvider()]


def extension() -> KitExtension:
    return KitExtension()
