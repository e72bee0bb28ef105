"""Submits this node's events to the master as `LocalEvent`s until each is confirmed.

Every event gets the next sequence number of this process's session. It is re-sent every
`RESEND_INTERVAL_S` (and at once when a new master session starts) until the node sees it
come back indexed on GLOBAL_EVENTS, because pub/sub keeps no history: a master elected after
the first send, or a message lost in a reconnect, must not lose a worker's fact. The master
dedups by (origin, session, seq), so re-sending is safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from skulk.routing.router import Router, RouterError
from skulk.routing.topics import TOPICS
from skulk.shared.types.events import Event, IndexedEvent, LocalEvent
from skulk.shared.types.ids import NodeId, SessionId

logger = logging.getLogger(__name__)

RESEND_INTERVAL_S = 1.0
MAX_UNCONFIRMED_EVENTS = 4096
"""Bound on events awaiting confirmation; beyond it the oldest is dropped and counted."""


class EventProducer:
    def __init__(self, router: Router) -> None:
        self._router = router
        self._next_seq = 0
        self._unconfirmed: OrderedDict[int, LocalEvent] = OrderedDict()
        self._wake = asyncio.Event()
        self._resend_requested = False
        self.dropped = 0
        self.confirmed = 0
        self.sent = 0

    @property
    def node_id(self) -> NodeId:
        return NodeId(self._router.node_id)

    def submit(self, event: Event) -> int:
        """Queue `event` for the master; returns its sequence number."""
        seq = self._next_seq
        self._next_seq += 1
        local = LocalEvent(origin=self.node_id, origin_session=SessionId(self._router.session_id), origin_seq=seq,
                           event=event)
        self._unconfirmed[seq] = local
        while len(self._unconfirmed) > MAX_UNCONFIRMED_EVENTS:
            self._unconfirmed.popitem(last=False)
            self.dropped += 1
        self._wake.set()
        return seq

    def is_pending(self, seq: int) -> bool:
        return seq in self._unconfirmed

    def observe(self, indexed: IndexedEvent) -> None:
        """Called for every applied indexed event: confirm ours."""
        if indexed.origin != self._router.node_id or indexed.origin_session != self._router.session_id:
            return
        if indexed.origin_seq is None:
            return
        for seq in [s for s in self._unconfirmed if s <= indexed.origin_seq]:
            del self._unconfirmed[seq]
            self.confirmed += 1

    def resend_all(self) -> None:
        """A new master session: send everything unconfirmed now."""
        self._resend_requested = True
        self._wake.set()

    async def _wait_for_work(self) -> bool:
        """True when woken by new work, False when the resend timer fired. With nothing
        unconfirmed there is nothing to resend, so no timer: an idle node does not wake for
        it (a submit wakes this at once)."""
        try:
            async with asyncio.timeout(RESEND_INTERVAL_S if self._unconfirmed else None):
                await self._wake.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._wake.clear()

    async def run(self) -> None:
        sent_up_to = -1
        while True:
            woken = await self._wait_for_work()
            resend_everything = not woken or self._resend_requested
            self._resend_requested = False
            for seq, local in list(self._unconfirmed.items()):
                if not resend_everything and seq <= sent_up_to:
                    continue
                try:
                    await self._router.publish(TOPICS.local_events, local)
                    self.sent += 1
                except RouterError as exc:
                    logger.warning("could not send event %s to the master: %s", seq, exc)
                    break
                sent_up_to = max(sent_up_to, seq)

    def stats(self) -> dict[str, int]:
        return {
            "unconfirmed": len(self._unconfirmed),
            "capacity": MAX_UNCONFIRMED_EVENTS,
            "dropped": self.dropped,
            "confirmed": self.confirmed,
            "sent": self.sent,
        }
