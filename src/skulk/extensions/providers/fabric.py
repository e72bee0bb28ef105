"""One node's end of capability calls: its provider server and its caller-side client, and
which of them each arriving message is for.

The node's receive loops hand every `provider_calls` and `provider_data` message to
`deliver`; `publish_control` and `publish_data` put a message on those topics, addressed to
one node. A message to this node itself never touches the network (it is delivered on the
next loop turn, in order). `run` is the housekeeping loop (gap expiry) and owns nothing
else; `close` ends every call on shutdown.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from pydantic import BaseModel

from skulk.extensions.providers.client import CapabilityClient
from skulk.extensions.providers.registry import ProviderRegistry
from skulk.extensions.providers.server import ProviderServer
from skulk.shared.types.providers import (
    CancelCall,
    CapabilitiesDescribed,
    DescribeCapabilities,
    OpenCall,
    ProviderFrame,
)

Publish = Callable[[str, BaseModel], Awaitable[None]]

TICK_S: Final = 1.0
"""How often gaps are checked for expiry (`bounds.GAP_EXPIRY_S` is a few ticks)."""


class ProviderFabric:
    def __init__(
        self,
        node_id: str,
        registry: ProviderRegistry,
        publish_control: Publish,
        publish_data: Publish,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_id = node_id
        self.registry = registry
        self._publish_control = publish_control
        self._publish_data = publish_data
        self.server = ProviderServer(registry, node_id, self._send, clock)
        self.client = CapabilityClient(node_id, self._send, clock)

    async def _send(self, node: str, message: BaseModel) -> None:
        if node == self.node_id:
            asyncio.get_running_loop().call_soon(self.deliver, self.node_id, message)
            return
        publish = self._publish_data if isinstance(message, ProviderFrame) else self._publish_control
        await publish(node, message)

    def deliver(self, sender: str, message: Any) -> None:
        """Hand one received message to the side it is for."""
        match message:
            case ProviderFrame(direction="output"):
                self.client.on_output(sender, message)
            case ProviderFrame():
                self.server.on_input(sender, message)
            case OpenCall():
                self.server.on_open(sender, message)
            case CancelCall():
                self.server.on_cancel(sender, message)
            case DescribeCapabilities():
                self.server.on_describe(sender, message)
            case CapabilitiesDescribed():
                self.client.on_described(sender, message)
            case _:
                pass

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(TICK_S)
                self.server.tick()
                self.client.tick()
        finally:
            await self.close()

    async def close(self) -> None:
        await asyncio.gather(self.client.close(), self.server.close())

    def capability_tags(self) -> tuple[str, ...]:
        return self.registry.capability_tags()

    def stats(self) -> dict[str, Any]:
        return {"registry": self.registry.stats(), "serving": self.server.stats(), "calling": self.client.stats()}


__all__ = ["TICK_S", "ProviderFabric", "Publish"]
