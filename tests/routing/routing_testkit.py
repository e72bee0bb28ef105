"""Shared pieces of the routing tests: test wire types, free ports, deadlines, router factory.

Imported by the test modules and by `routing_peer.py` (the child process of the
multi-process test), so it must not import pytest at module level.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Callable
from typing import Any

from skulk.routing.cluster_key import derive_wire_key
from skulk.routing.constants import NETWORK_VERSION
from skulk.routing.router import Received, Router, RouterOpenError, TypedSubscription
from skulk.routing.topics import Plane, Topic
from skulk.shared.types.base import WireModel


class Ping(WireModel):
    nonce: int
    sent_by: str = ""


class Reading(WireModel):
    node_name: str
    value: float


class Chunk(WireModel):
    stream_id: str
    index: int


PING = Topic("test_ping", Plane.CONTROL, Ping)
PONG = Topic("test_pong", Plane.CONTROL, Ping)
READINGS = Topic("test_readings", Plane.TELEMETRY, Reading)
CHUNKS = Topic("test_chunks", Plane.DATA, Chunk, node_addressed=True)

DEADLINE_S = 5.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def endpoint(port: int) -> str:
    return f"tcp/127.0.0.1:{port}"


async def eventually(predicate: Callable[[], bool], *, timeout_s: float = DEADLINE_S, what: str = "condition") -> None:
    """Poll `predicate` until true; fail the test with `what` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)


async def next_item(stream: Any, *, timeout_s: float = DEADLINE_S) -> Any:
    return await asyncio.wait_for(stream.get(), timeout_s)


async def publish_until_received(
    router: Router,
    topic: Topic,
    make: Callable[[int], Any],
    subscription: TypedSubscription[Any],
    *,
    accept: Callable[[Received[Any]], bool] = lambda item: True,
    to_node: str | None = None,
    timeout_s: float = DEADLINE_S,
) -> Received[Any]:
    """Publish probes until `subscription` yields one that `accept`s.

    zenoh pub/sub keeps no history: until the subscriber's declaration has reached the
    publisher, puts go nowhere. Probing with a deadline is how a test knows the path is up.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    attempt = 0
    while loop.time() < deadline:
        attempt += 1
        await router.publish(topic, make(attempt), to_node=to_node)
        try:
            while True:
                item = await asyncio.wait_for(subscription.get(), 0.05)
                if accept(item):
                    return item
        except TimeoutError:
            continue
    raise AssertionError(f"nothing from {router.node_id} reached {subscription.key_expr} within {timeout_s}s")


async def receive_until(
    subscription: TypedSubscription[Any], accept: Callable[[Received[Any]], bool], *, timeout_s: float = DEADLINE_S
) -> Received[Any]:
    """Take items until one is accepted (earlier ones are discarded)."""

    async def scan() -> Received[Any]:
        while not accept(item := await subscription.get()):
            pass
        return item

    return await asyncio.wait_for(scan(), timeout_s)


async def publish_until(
    router: Router,
    topic: Topic,
    make: Callable[[int], Any],
    done: Callable[[], bool],
    *,
    to_node: str | None = None,
    timeout_s: float = DEADLINE_S,
    what: str = "condition",
) -> None:
    """Keep publishing until `done()`: for effects only visible in counters (rejects)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    attempt = 0
    while not done():
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s publishing from {router.node_id} until {what}")
        attempt += 1
        await router.publish(topic, make(attempt), to_node=to_node)
        await asyncio.sleep(0.02)


class RouterFactory:
    """Opens routers on free loopback ports with multicast off and closes them all at the end."""

    def __init__(self) -> None:
        self.routers: list[Router] = []

    async def open(
        self,
        node_id: str,
        *,
        connect: list[str] | None = None,
        cluster_key: str = "test-cluster-key",
        network_version: str = NETWORK_VERSION,
        listen: bool = True,
    ) -> tuple[Router, str]:
        last_error: Exception | None = None
        for _ in range(5):  # a free port can be taken between probe and bind
            port = free_port()
            try:
                router = await Router.open(
                    node_id=node_id,
                    session_id=uuid.uuid4().hex[:12],
                    listen=[endpoint(port)] if listen else [],
                    connect=connect or [],
                    multicast=False,
                    wire_key=derive_wire_key(cluster_key, network_version),
                    network_version=network_version,
                )
            except RouterOpenError as exc:
                last_error = exc
                continue
            self.routers.append(router)
            return router, endpoint(port)
        raise AssertionError(f"could not open a router: {last_error}")

    async def aclose(self) -> None:
        await asyncio.gather(*(router.close() for router in self.routers), return_exceptions=True)


async def wait_connected(*routers: Router, peers: int = 1) -> None:
    for router in routers:
        await eventually(lambda r=router: r.connected_peer_count() >= peers, what=f"{router.node_id} to see {peers} peer(s)")

