"""Child process of the multi-process router test: a peer that answers pings.

Run as `python -m tests.routing.routing_peer --node-id ID --connect EP --cluster-key KEY`
from the repository root. It declares presence, answers every PING with a PONG carrying the
same nonce, and closes its router and exits 0 on a PING with a negative nonce.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import uuid

from skulk.routing.cluster_key import derive_wire_key
from skulk.routing.constants import NETWORK_VERSION
from skulk.routing.router import Router
from tests.routing.routing_testkit import PING, PONG, READINGS, Ping, Reading

# The parent kills us if we outlive this; we also give up on our own.
LIFETIME_S = 30.0


async def serve(node_id: str, connect: list[str], cluster_key: str) -> int:
    router = await Router.open(
        node_id=node_id,
        session_id=uuid.uuid4().hex[:12],
        listen=[],  # outbound only: the parent listens
        connect=connect,
        multicast=False,
        wire_key=derive_wire_key(cluster_key, NETWORK_VERSION),
    )
    try:
        pings = router.subscribe(PING)
        router.declare_presence()
        async with asyncio.timeout(LIFETIME_S):
            async for item in pings:
                if item.message.nonce < 0:
                    return 0
                await router.publish(PONG, Ping(nonce=item.message.nonce, sent_by=node_id))
                await router.publish(READINGS, Reading(node_name=node_id, value=float(item.message.nonce)))
        return 1
    finally:
        await router.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--connect", action="append", default=[])
    parser.add_argument("--cluster-key", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    sys.exit(asyncio.run(serve(args.node_id, args.connect, args.cluster_key)))


if __name__ == "__main__":
    main()
