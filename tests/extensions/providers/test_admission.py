"""Admission: the ordered rules an open passes before any provider code runs."""

from __future__ import annotations

from typing import Any

import pytest

from skulk.extensions.providers.bounds import MAX_CALL_TIMEOUT_S, MAX_INPUT_BYTES
from skulk.extensions.providers.registry import ProviderRegistry, Registered
from skulk.extensions.providers.server import open_refusal
from skulk.shared.types.providers import OpenCall
from tests.extensions.provider_kit import KitProvider

REGISTRY = ProviderRegistry()
REGISTRY.add(KitProvider(), "kit")


def entry(cid: str) -> Registered:
    found = REGISTRY.get(cid, "1.0.0")
    assert found is not None
    return found


def opening(cid: str = "echo", **over: Any) -> OpenCall:
    fields: dict[str, Any] = {
        "call_id": "c",
        "capability_id": cid,
        "version": "1.0.0",
        "revision": entry(cid).descriptor.revision if cid in ("echo", "sum", "count") else "r",
        "input": {"text": "x"},
        "timeout_s": 5.0,
    }
    return OpenCall(**{**fields, **over})


@pytest.mark.parametrize(
    ("cid", "over", "active", "kind"),
    [
        ("echo", {}, 0, None),
        ("echo", {"revision": "0" * 64}, 0, "revision_mismatch"),
        # the revision outranks the input: a stale caller re-reads before fixing its input
        ("echo", {"revision": "0" * 64, "input": {"text": 1}}, 0, "revision_mismatch"),
        ("echo", {"io_modes": ("server_streaming",)}, 0, "mode_unsupported"),
        ("echo", {"timeout_s": MAX_CALL_TIMEOUT_S + 1}, 0, "input_invalid"),
        ("echo", {"input": {"text": "x" * MAX_INPUT_BYTES}}, 0, "payload_too_large"),
        ("echo", {"input": {"text": 1}}, 0, "input_invalid"),
        ("echo", {"input": None}, 0, "input_invalid"),
        ("sum", {"input": None}, 0, None),
        ("sum", {"input": {"n": 1}}, 0, "input_invalid"),
        ("count", {"input": {"n": 101}}, 0, "input_invalid"),
        # the node's load comes last: only then does a retry help
        ("echo", {}, 32, "overloaded"),
        ("echo", {"input": {"text": 1}}, 32, "input_invalid"),
    ],
)
def test_open_refusal(cid, over, active, kind):
    refusal = open_refusal(entry(cid), opening(cid, **over), active_calls=active, max_calls=32)
    assert (refusal.kind if refusal else None) == kind


def test_an_unknown_capability_is_not_found():
    refusal = open_refusal(None, opening(), active_calls=0)
    assert refusal is not None and refusal.kind == "capability_not_found"
