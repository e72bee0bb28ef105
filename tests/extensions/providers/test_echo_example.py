"""The reference provider package (examples/extensions/echo-provider) works as documented:
its entry point loads as an extension and both capabilities answer across two fabrics."""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from skulk.extensions.loader import ENTRY_POINT_GROUP, load_from
from skulk.extensions.providers.errors import CapabilityError
from skulk.extensions.providers.registry import ProviderRegistry, registry_from
from tests.extensions.providers.wire_kit import Wire

PACKAGE = Path(__file__).resolve().parents[3] / "examples" / "extensions" / "echo-provider"


@pytest.fixture
def entry_point() -> Iterator[EntryPoint]:
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    ((name, value),) = project["entry-points"][ENTRY_POINT_GROUP].items()
    sys.path.insert(0, str(PACKAGE / "src"))
    try:
        yield EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)
    finally:
        sys.path.remove(str(PACKAGE / "src"))
        sys.modules.pop("skulk_echo_provider", None)


async def test_the_echo_provider_serves_its_two_capabilities_across_nodes(entry_point):
    found = load_from([entry_point])
    assert not found.skipped and [ext.shape.name for ext in found.with_hook("providers")] == ["echo-provider"]
    registry = registry_from((ext.shape.name, ext.obj.providers) for ext in found.with_hook("providers"))
    assert registry.capability_tags() == ("echo.stream@1.0.0", "echo@1.0.0") and not registry.refused

    wire = Wire()
    caller, provider = wire.add("a", ProviderRegistry()), wire.add("b", registry)
    try:
        described = {d.id: d for d in await caller.client.describe("b")}
        assert await caller.client.call("b", "echo", "1.0.0", described["echo"].revision, {"text": "hi"}) == {
            "text": "hi"
        }
        stream = await caller.client.call_capability(
            "b", "echo.stream", "1.0.0", described["echo.stream"].revision, {"text": "yo", "repeat": 3}
        )
        assert [chunk async for chunk in stream] == [{"index": i, "text": "yo"} for i in range(3)]
        with pytest.raises(CapabilityError) as refused:
            await caller.client.call("b", "echo", "1.0.0", described["echo"].revision, {"text": "hi", "x": 1})
        assert refused.value.kind == "input_invalid"
    finally:
        await caller.close()
        await provider.close()
