"""An in-memory wire between capability fabrics, for tests: every message is carried
through its topic's wire form (what the router does, without zenoh)."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from skulk.extensions.providers.fabric import ProviderFabric
from skulk.extensions.providers.registry import ProviderRegistry
from skulk.routing.topics import TOPICS


class Wire:
    """Delivers to a fabric on the next loop turn, in order; a node not on it never answers."""

    def __init__(self) -> None:
        self.nodes: dict[str, ProviderFabric] = {}

    def publisher(self, sender: str, topic_name: str):
        topic = getattr(TOPICS, topic_name)

        async def publish(node: str, message: BaseModel) -> None:
            decoded = topic.type_adapter.validate_python(message.model_dump(mode="json", by_alias=True))
            target = self.nodes.get(node)
            if target is not None:
                asyncio.get_running_loop().call_soon(target.deliver, sender, decoded)

        return publish

    def add(self, node: str, registry: ProviderRegistry) -> ProviderFabric:
        fabric = ProviderFabric(
            node, registry, self.publisher(node, "provider_calls"), self.publisher(node, "provider_data")
        )
        self.nodes[node] = fabric
        return fabric
