"""Keeps State's account of this node true: membership, interfaces and this node's edges.

Every `RECONCILE_INTERVAL_S` (once synced with a master) it asks the pure
`plan_membership` what State is missing and submits it through the event producer. A
separate loop probes peers' advertised API addresses (`GET /node_id` must answer with the
peer's id) to find verified paths; an address that keeps failing is retried on a slower
cadence so a remote member does not flood the logs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable
from urllib.parse import urlsplit

import httpx

from skulk.cluster.producer import EventProducer
from skulk.cluster.replica import StateReplica
from skulk.routing.router import Router
from skulk.shared.membership import MembershipView, SelfInfo, plan_membership
from skulk.shared.ticks import until_tick_s
from skulk.shared.types.events import NodeLeft
from skulk.shared.types.ids import EventId, NodeId, new_id
from skulk.shared.types.state import State

logger = logging.getLogger(__name__)

RECONCILE_INTERVAL_S = 1.0
PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 2.0
FAILED_ADDRESS_RETRY_S = 60.0
LEAVE_CONFIRM_DEADLINE_S = 1.5


def probe_candidates(state: State, me: str) -> dict[NodeId, list[str]]:
    """Peer -> API base URLs to try: each of its interface addresses on its API port."""
    candidates: dict[NodeId, list[str]] = {}
    for peer, info in state.nodes.items():
        if peer == me or not info.api_endpoint:
            continue
        parts = urlsplit(info.api_endpoint)
        if parts.port is None:
            continue
        urls = [f"{parts.scheme}://{address}:{parts.port}"
                for interface in state.node_network.get(peer, []) for address in interface.addresses]
        candidates[peer] = urls or [info.api_endpoint]
    return candidates


class MembershipService:
    def __init__(
        self,
        router: Router,
        replica: StateReplica,
        producer: EventProducer,
        me: SelfInfo,
        *,
        api_key: Callable[[], str | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._router = router
        self._replica = replica
        self._producer = producer
        self._me = me
        self._api_key = api_key
        self._clock = clock
        self._pending: dict[Hashable, int] = {}
        self.probed: dict[NodeId, str] = {}
        self._failed_at: dict[str, float] = {}
        self.submitted = 0

    def _reconcile(self, live_peers: frozenset[NodeId]) -> None:
        self._pending = {k: seq for k, seq in self._pending.items() if self._producer.is_pending(seq)}
        view = MembershipView(
            state=self._replica.state,
            me=self._me,
            live_peers=live_peers,
            probed=dict(self.probed),
            pending=frozenset(self._pending),
        )
        for key, event in plan_membership(view, new_id):
            self._pending[key] = self._producer.submit(event)
            self.submitted += 1

    async def _reconcile_loop(self) -> None:
        presence = self._router.watch_presence()
        me = self._router.node_id
        loop = asyncio.get_running_loop()
        while True:
            if self._replica.synced:
                self._reconcile(frozenset(NodeId(peer) for peer in presence.alive()) - {NodeId(me)})
            await asyncio.sleep(until_tick_s(loop.time(), RECONCILE_INTERVAL_S))  # on the tick grid (`shared.ticks`)

    async def _probe_once(self, client: httpx.AsyncClient) -> None:
        now = self._clock()
        verified: dict[NodeId, str] = {}
        for peer, urls in probe_candidates(self._replica.state, self._router.node_id).items():
            for url in urls:
                if now - self._failed_at.get(url, float("-inf")) < FAILED_ADDRESS_RETRY_S:
                    continue
                try:
                    headers = {"Authorization": f"Bearer {key}"} if (key := self._api_key()) else {}
                    response = await client.get(f"{url}/node_id", headers=headers)
                    ok = response.status_code == 200 and response.json().get("nodeId") == peer
                except (httpx.HTTPError, ValueError, AttributeError):
                    ok = False
                if ok:
                    verified[peer] = url
                    self._failed_at.pop(url, None)
                    break
                self._failed_at[url] = now
        self.probed = verified

    async def _probe_loop(self) -> None:
        loop = asyncio.get_running_loop()
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
            while True:
                if self._replica.synced:
                    await self._probe_once(client)
                await asyncio.sleep(until_tick_s(loop.time(), PROBE_INTERVAL_S))

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._reconcile_loop())
            group.create_task(self._probe_loop())

    async def leave(self) -> None:
        """Tell the cluster this node is leaving; wait briefly for the master to index it."""
        if not self._replica.synced or self._router.node_id not in self._replica.state.nodes:
            return
        seq = self._producer.submit(NodeLeft(event_id=EventId(new_id()), node_id=NodeId(self._router.node_id)))
        deadline = self._clock() + LEAVE_CONFIRM_DEADLINE_S
        while self._producer.is_pending(seq) and self._clock() < deadline:
            await asyncio.sleep(0.05)

    def stats(self) -> dict[str, object]:
        return {"pendingFacts": len(self._pending), "submitted": self.submitted, "verifiedPeers": sorted(self.probed)}
