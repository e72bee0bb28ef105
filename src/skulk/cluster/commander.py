"""Submit commands to a cluster from outside a node: benchmarks, tests, scripts.

It joins the transport with the cluster key like any node (so it is authenticated) but
takes no part in election or membership: it only publishes on the COMMANDS topic.
"""

from __future__ import annotations

from collections.abc import Sequence

from skulk.routing.cluster_key import derive_wire_key
from skulk.routing.constants import NETWORK_VERSION
from skulk.routing.router import Router
from skulk.routing.topics import TOPICS
from skulk.shared.types.commands import Command, ForwarderCommand
from skulk.shared.types.ids import NodeId, new_id


class Commander:
    def __init__(self, router: Router) -> None:
        self._router = router

    @classmethod
    async def connect(cls, cluster_key: str, peers: Sequence[str]) -> Commander:
        router = await Router.open(
            node_id=f"commander-{new_id()[:12]}",
            session_id=new_id(),
            listen=["tcp/127.0.0.1:0"],
            connect=list(peers),
            multicast=False,
            wire_key=derive_wire_key(cluster_key, NETWORK_VERSION),
        )
        return cls(router)

    async def submit(self, command: Command) -> None:
        await self._router.publish(TOPICS.commands, ForwarderCommand(origin=NodeId(self._router.node_id), command=command))

    def connected_peers(self) -> int:
        return self._router.connected_peer_count()

    async def close(self) -> None:
        await self._router.close()

    async def __aenter__(self) -> Commander:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
