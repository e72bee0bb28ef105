"""Capability calls between two nodes' fabrics over an in-memory wire that carries every
message through its topic's wire form (what the router does, without zenoh)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from skulk.extensions.providers import client as client_module
from skulk.extensions.providers.errors import CapabilityError
from skulk.extensions.providers.fabric import ProviderFabric
from skulk.extensions.providers.registry import ProviderRegistry
from tests.extensions import provider_kit
from tests.extensions.provider_kit import KitProvider
from tests.extensions.providers.wire_kit import Wire

CALLER, PROVIDER = "node-a", "node-b"


@pytest.fixture
async def pair() -> AsyncIterator[tuple[ProviderFabric, ProviderFabric]]:
    provider_kit.closed.clear()
    wire = Wire()
    registry = ProviderRegistry()
    registry.add(KitProvider(), "provider-kit")
    a, b = wire.add(CALLER, ProviderRegistry()), wire.add(PROVIDER, registry)
    yield a, b
    await a.close()
    await b.close()


def rev(fabric: ProviderFabric, cid: str) -> str:
    entry = fabric.registry.get(cid, "1.0.0")
    assert entry is not None
    return entry.descriptor.revision


async def fails(kind: str, awaitable: Any) -> CapabilityError:
    with pytest.raises(CapabilityError) as caught:
        await awaitable
    assert caught.value.kind == kind, caught.value
    return caught.value


async def collect(call: Any) -> list[Any]:
    return [chunk async for chunk in call]


async def test_describe_lists_the_remote_nodes_descriptors(pair):
    a, b = pair
    found = await a.client.describe(PROVIDER)
    assert {d.tag for d in found} == set(b.registry.capability_tags())
    assert await a.client.describe(CALLER) == ()


async def test_unary_and_server_streaming_calls_across_nodes(pair):
    a, b = pair
    assert await a.client.call(PROVIDER, "echo", "1.0.0", rev(b, "echo"), {"text": "hi"}) == {"text": "hi"}
    call = await a.client.call_capability(PROVIDER, "count", "1.0.0", rev(b, "count"), {"n": 5})
    assert await collect(call) == [{"i": i} for i in range(5)]
    assert b.server.counts["completed"] == 2


async def test_a_node_calls_its_own_capabilities_in_process(pair):
    _, b = pair
    assert await b.client.call(PROVIDER, "echo", "1.0.0", rev(b, "echo"), {"text": "me"}) == {"text": "me"}


@pytest.mark.parametrize(
    ("cid", "version", "revision", "payload", "kind"),
    [
        ("echo", "1.0.0", None, {"text": 1}, "input_invalid"),
        ("echo", "1.0.0", None, {"txt": "x"}, "input_invalid"),
        ("echo", "1.0.0", "0" * 64, {"text": "x"}, "revision_mismatch"),
        ("echo", "9.0.0", "0" * 64, {"text": "x"}, "capability_not_found"),
        ("nope", "1.0.0", "0" * 64, {"text": "x"}, "capability_not_found"),
        ("sum", "1.0.0", None, {"n": 1}, "input_invalid"),  # a streaming-input call takes no input value
    ],
)
async def test_refusals_come_before_the_provider_runs(pair, cid, version, revision, payload, kind):
    a, b = pair
    call = await a.client.call_capability(PROVIDER, cid, version, revision or rev(b, cid), payload)
    await fails(kind, collect(call))
    assert b.server.counts["opened"] == 0 and b.server.counts["refused"] == 1


async def test_a_caller_that_drives_no_input_stream_is_refused_a_streaming_input_capability(pair):
    a, b = pair
    call = await a.client.call_capability(
        PROVIDER, "upper", "1.0.0", rev(b, "upper"), io_modes=("unary", "server_streaming")
    )
    await fails("mode_unsupported", call.result())


async def test_bad_provider_output_is_a_typed_error(pair):
    a, b = pair
    error = await fails(
        "output_invalid", a.client.call(PROVIDER, "bad-output", "1.0.0", rev(b, "bad-output"), {"text": "x"})
    )
    assert error.node == PROVIDER and "text" in error.message


async def test_the_dynamic_admission_hook_refuses_before_anything_streams(pair):
    a, b = pair
    error = await fails(
        "admission_refused", a.client.call(PROVIDER, "closed", "1.0.0", rev(b, "closed"), {"text": "x"})
    )
    assert error.message == "the mounted model is gone"


async def test_a_raising_provider_fails_only_its_own_call(pair):
    a, b = pair
    error = await fails("provider_failed", a.client.call(PROVIDER, "boom", "1.0.0", rev(b, "boom"), {"text": "x"}))
    assert error.message.startswith("RuntimeError: provider bug") and len(error.message) <= 2048
    assert await a.client.call(PROVIDER, "echo", "1.0.0", rev(b, "echo"), {"text": "still"}) == {"text": "still"}


async def test_a_call_past_its_deadline_ends_deadline_exceeded(pair):
    a, b = pair
    await fails(
        "deadline_exceeded", a.client.call(PROVIDER, "hang", "1.0.0", rev(b, "hang"), {"text": "x"}, timeout_s=0.2)
    )
    assert b.server.counts["failed"] == 1


async def test_a_caller_leaving_a_stream_cancels_it_and_closes_the_handler(pair):
    a, b = pair
    call = await a.client.call_capability(PROVIDER, "wait-stream", "1.0.0", rev(b, "wait-stream"), {"n": 1})
    stream = call.outputs()
    assert await anext(stream) == {"i": 0}
    await stream.aclose()
    await wait_for(lambda: b.server.counts["cancelled"] == 1)
    assert "wait-stream" in provider_kit.closed
    assert b.server.counts["iteratorsClosed"] == 1


async def test_an_explicit_cancel_ends_the_call_cancelled(pair):
    a, b = pair
    call = await a.client.call_capability(PROVIDER, "wait-stream", "1.0.0", rev(b, "wait-stream"), {"n": 1})
    await call.wait_started()
    await call.cancel("changed my mind")
    await fails("cancelled", call.result())
    await wait_for(lambda: "wait-stream" in provider_kit.closed)


async def test_a_malformed_chunk_closes_the_handler_before_the_synthetic_failure(pair):
    a, b = pair
    call = await a.client.call_capability(PROVIDER, "malformed", "1.0.0", rev(b, "malformed"), {"n": 1})
    got: list[Any] = []
    with pytest.raises(CapabilityError) as caught:
        async for chunk in call:
            got.append(chunk)
    assert caught.value.kind == "malformed_chunk"
    assert got == [{"i": 0}]
    assert provider_kit.closed == ["malformed"]  # closed before the failure went out


async def test_the_terminal_waits_for_the_handlers_finally(pair):
    a, b = pair
    call = await a.client.call_capability(PROVIDER, "slow-close", "1.0.0", rev(b, "slow-close"), {"n": 1})
    assert await collect(call) == [{"i": 0}]
    assert provider_kit.closed == ["slow-close"]


async def test_client_streaming_sends_input_then_half_closes(pair):
    a, b = pair
    call = await a.client.call_capability(PROVIDER, "sum", "1.0.0", rev(b, "sum"))
    for n in (1, 2, 3):
        await call.send({"n": n})
    await call.complete()
    assert await call.result() == {"total": 6}


async def test_bidi_output_stays_open_after_the_input_half_close(pair):
    a, b = pair
    call = await a.client.call_capability(PROVIDER, "upper", "1.0.0", rev(b, "upper"))
    stream = call.outputs()
    await call.send({"text": "a"})
    assert await anext(stream) == {"text": "A"}
    await call.send({"text": "b"})
    await call.complete()
    assert [chunk async for chunk in stream] == [{"text": "B"}, {"text": "<done>"}]


async def test_a_bad_input_chunk_ends_the_call_input_invalid(pair):
    a, b = pair
    call = await a.client.call_capability(PROVIDER, "sum", "1.0.0", rev(b, "sum"))
    await call.send({"n": "three"})
    await fails("input_invalid", call.result())


async def test_a_node_that_never_answers_is_unreachable(pair, monkeypatch):
    a, _ = pair
    monkeypatch.setattr(client_module, "OPEN_TIMEOUT_S", 0.2)
    call = await a.client.call_capability("node-gone", "echo", "1.0.0", "0" * 64, {"text": "x"})
    await fails("node_unreachable", call.result())
    await fails("node_unreachable", a.client.describe("node-gone", timeout_s=0.2))


async def test_one_slow_reader_ends_only_its_own_call(pair, monkeypatch):
    a, b = pair
    monkeypatch.setattr(client_module, "CALL_QUEUE_FRAMES", 4)
    slow = await a.client.call_capability(PROVIDER, "count", "1.0.0", rev(b, "count"), {"n": 50})
    await wait_for(lambda: slow.done)  # nobody reads it: its queue fills
    assert await a.client.call(PROVIDER, "echo", "1.0.0", rev(b, "echo"), {"text": "ok"}) == {"text": "ok"}
    await fails("overloaded", collect(slow))


async def test_the_node_concurrency_bound_refuses_overloaded(pair):
    a, b = pair
    b.server.max_calls = 1
    first = await a.client.call_capability(PROVIDER, "wait-stream", "1.0.0", rev(b, "wait-stream"), {"n": 1})
    await first.wait_started()
    second = await a.client.call_capability(PROVIDER, "echo", "1.0.0", rev(b, "echo"), {"text": "x"})
    await fails("overloaded", second.result())
    await first.cancel()


async def wait_for(condition: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)
