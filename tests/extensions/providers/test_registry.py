"""The guarded registry: what a node agrees to serve, and why it refuses the rest."""

from __future__ import annotations

from typing import Any

import pytest

from skulk.extensions.providers.bounds import MAX_DESCRIPTOR_BYTES, MAX_DESCRIPTORS_PER_NODE
from skulk.extensions.providers.registry import ProviderRegistry, registration_refusal, registry_from
from skulk.routing.topics import TOPICS
from skulk.shared.types.providers import CapabilityDescriptor
from tests.extensions.provider_kit import KitProvider


def desc(**over: Any) -> CapabilityDescriptor:
    base: dict[str, Any] = {
        "id": "echo",
        "version": "1.0.0",
        "description": "d",
        "io_mode": "unary",
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
    }
    return CapabilityDescriptor(**{**base, **over})


class Unary:
    def handle_call(self, *_: Any) -> Any:
        return {}


class Streams:
    def handle_stream(self, *_: Any) -> Any:
        return None


@pytest.mark.parametrize(
    ("descriptor", "provider", "taken", "reason"),
    [
        (desc(), Unary(), [], None),
        (desc(io_mode="server_streaming"), Streams(), [], None),
        (desc(input_schema={"type": "nope"}), Unary(), [], "input_schema is not a valid JSON Schema"),
        (desc(output_schema={"minimum": "x"}), Unary(), [], "output_schema is not a valid JSON Schema"),
        (desc(), Streams(), [], "a unary capability needs handle_call"),
        (desc(io_mode="bidi_streaming"), Unary(), [], "a bidi_streaming capability needs handle_stream"),
        (desc(), Unary(), ["echo@1.0.0"], "echo@1.0.0 is already served on this node"),
        (desc(version="1.1.0"), Unary(), ["echo@1.0.0"], None),
        (desc(description="x" * 4000, input_schema={"enum": ["y" * 1000] * 50}), Unary(), [], "over the cap"),
    ],
)
def test_registration_refusal(descriptor, provider, taken, reason):
    got = registration_refusal(descriptor, provider, taken)
    assert (got is None) == (reason is None)
    assert reason is None or (got is not None and reason in got)


def test_the_revision_pins_every_field_of_the_descriptor():
    assert desc().revision == desc().revision
    assert desc().revision != desc(description="other").revision
    assert len(desc().revision) == 64


def test_a_duplicate_id_at_version_is_refused_with_a_reason_and_the_first_stays():
    registry = ProviderRegistry()
    assert registry.add(KitProvider(), "first") == []
    refused = registry.add(KitProvider(), "second")
    assert {r.capability for r in refused} >= {"echo@1.0.0", "count@1.0.0"}
    assert all("already served" in r.reason for r in refused)
    entry = registry.get("echo", "1.0.0")
    assert entry is not None and entry.source == "first"
    assert "echo@1.0.0" in registry.capability_tags()


class Raising:
    def descriptors(self) -> Any:
        raise RuntimeError("boom")


class Junk:
    def descriptors(self) -> Any:
        return [{"id": "Not An Id"}, 42]


def test_provider_code_that_raises_or_returns_junk_never_breaks_the_registry():
    def broken_providers() -> Any:
        raise ValueError("no providers today")

    registry = registry_from(
        [("raising", lambda: [Raising(), Junk()]), ("broken", broken_providers), ("kit", lambda: [KitProvider()])]
    )
    reasons = [(r.source, r.reason) for r in registry.refused]
    assert ("raising", "descriptors() raised RuntimeError: boom") in reasons
    assert any(source == "broken" and "providers() raised ValueError" in reason for source, reason in reasons)
    assert sum(1 for source, reason in reasons if "not a capability descriptor" in reason) == 2
    assert registry.get("count", "1.0.0") is not None


def test_a_nodes_whole_describe_answer_fits_its_topic():
    framing = 64 * 1024
    assert MAX_DESCRIPTOR_BYTES * MAX_DESCRIPTORS_PER_NODE + framing <= (TOPICS.provider_calls.max_payload_bytes or 0)
