"""This node's copy of the cluster State, kept in step with the master.

Followers apply the master's indexed events strictly in index order (`shared.sync` decides
what is applicable and when to ask for a replay). On every new master session a follower
asks for a snapshot and adopts it wholesale, because the old session may have left it with
events the new master never saw. The master itself applies its own events directly
(`apply_indexed`), so its replica is the state it plans from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable

from skulk.routing.router import Received, Router, RouterError
from skulk.routing.topics import TOPICS
from skulk.shared.apply import EventOutOfOrder, apply
from skulk.shared.sync import (
    MAX_BUFFERED_EVENTS,
    drain,
    follower_buffer,
    follower_needs_ticks,
    on_master_high_water,
    on_tick,
    receive,
    reset,
)
from skulk.shared.types.election import ElectionMessage
from skulk.shared.types.events import IndexedEvent
from skulk.shared.types.ids import NodeId, SessionId
from skulk.shared.types.state import State
from skulk.shared.types.sync import EventBurst, GlobalEvent, SnapshotOffer, SyncRequest

logger = logging.getLogger(__name__)

SNAPSHOT_RETRY_S = 2.0
"""A follower that asked for a snapshot and heard nothing asks again after this long."""

TICK_S = 0.25
"""How often a follower with something to catch up on (no snapshot yet, or a gap in the
events) re-checks it. With nothing to catch up on (`follower_needs_ticks`) the ticker sleeps
until a message or a new session wakes it: the master, and a follower in step, never tick."""


def listener_name(listener: Callable[..., object]) -> str:
    """A stable name for a listener in logs and counters (`Node._fail_streams_of_failed_tasks`)."""
    return getattr(listener, "__qualname__", None) or type(listener).__qualname__


class StateReplica:
    def __init__(self, router: Router, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._router = router
        self._clock = clock
        self.state = State()
        self.master_id: NodeId | None = None
        self.session_id: SessionId | None = None
        self.i_am_master = False
        self.synced = False
        self._buffer = follower_buffer(0)
        self._held: deque[IndexedEvent] = deque(maxlen=MAX_BUFFERED_EVENTS)
        self._snapshot_requested_at: float | None = None
        self._master_high_water: int | None = None
        """The last index the master announced (`heard_leader`); checked on each tick."""
        self._listeners: list[Callable[[IndexedEvent], None]] = []
        self._session_listeners: list[Callable[[], None]] = []
        self._tick_wanted = asyncio.Event()
        """Set when the ticker, asleep for want of work, has some (after a message or a new session)."""
        self.ignored_foreign = 0
        self.snapshots_adopted = 0
        self.tail_requests = 0
        """Replays asked for because the master's announcement showed a missed tail."""
        self.applied = 0
        self.listener_errors: Counter[str] = Counter()
        """Exceptions raised by listeners, by listener name. A listener's bug is logged and
        counted here; it never stops the replica (the event is already applied and the other
        listeners, the master's logging among them, must still see it)."""

    @property
    def node_id(self) -> NodeId:
        return NodeId(self._router.node_id)

    def on_applied(self, listener: Callable[[IndexedEvent], None]) -> None:
        self._listeners.append(listener)

    def on_synced(self, listener: Callable[[], None]) -> None:
        """Called whenever this node becomes synced with a (new) master session."""
        self._session_listeners.append(listener)

    # -- sessions --------------------------------------------------------------------------

    def adopt_session(self, master_id: NodeId, session_id: SessionId, i_am_master: bool) -> None:
        if (master_id, session_id) == (self.master_id, self.session_id):
            return
        self.master_id, self.session_id, self.i_am_master = master_id, session_id, i_am_master
        self._buffer = follower_buffer(self.state.last_event_applied_idx + 1)
        self._held.clear()
        self._snapshot_requested_at = None
        self._master_high_water = None
        self.synced = i_am_master
        self._wake_ticker()
        logger.info("following master %s in session %s%s", master_id, session_id, " (this node)" if i_am_master else "")
        if i_am_master:
            self._notify_synced()

    def _notify_synced(self) -> None:
        for listener in self._session_listeners:
            self._call_isolated(listener)

    def _call_isolated(self, listener: Callable[..., None], *args: object) -> None:
        try:
            listener(*args)
        except Exception:
            name = listener_name(listener)
            self.listener_errors[name] += 1
            logger.exception("replica listener %s failed (%d so far); the replica carries on",
                             name, self.listener_errors[name])

    def heard_leader(self, message: ElectionMessage) -> None:
        """A leader's announcement (the election's pump hands every one over): our master's
        high-water mark, for a tail this follower may have missed."""
        if (message.kind != "leader" or message.high_water_idx is None or message.node_id != self.master_id
                or message.session_id != self.session_id or self.i_am_master):
            return
        self._master_high_water = message.high_water_idx
        self._wake_ticker()

    # -- applying --------------------------------------------------------------------------

    def apply_indexed(self, event: IndexedEvent) -> None:
        """Apply one event that is next in order (the master's own, or a follower's ready run)."""
        try:
            self.state = apply(self.state, event)
        except EventOutOfOrder as exc:
            logger.warning("replica out of order (%s); asking for a snapshot", exc)
            self.synced = self.i_am_master
            self._snapshot_requested_at = None
            return
        self.applied += 1
        for listener in self._listeners:
            self._call_isolated(listener, event)

    def _apply_run(self, events: list[IndexedEvent]) -> None:
        for event in events:
            self.apply_indexed(event)

    def _adopt_snapshot(self, offer: SnapshotOffer) -> None:
        self.state = offer.state
        self._buffer, ready = drain(reset(self._buffer, offer.high_water_idx + 1))
        self.synced = True
        self.snapshots_adopted += 1
        logger.info("adopted snapshot of session %s at idx %d", offer.session_id, offer.high_water_idx)
        self._apply_run(ready)
        # Events that arrived while we waited: those after the snapshot apply now.
        held, self._held = list(self._held), deque(maxlen=MAX_BUFFERED_EVENTS)
        for event in held:
            self._buffer, ready, _since = receive(self._buffer, event, self._clock())
            self._apply_run(ready)
        self._notify_synced()

    # -- the loop --------------------------------------------------------------------------

    def _needs_ticks(self) -> bool:
        return follower_needs_ticks(self.master_id is not None, self.i_am_master, self.synced, self._buffer)

    def _wake_ticker(self) -> None:
        if self._needs_ticks():
            self._tick_wanted.set()

    async def _request(self, since_idx: int, want_snapshot: bool) -> None:
        if self.master_id is None or self.session_id is None or self.i_am_master:
            return
        request = SyncRequest(
            node_id=self.node_id, session_id=self.session_id, since_idx=max(since_idx, 0), want_snapshot=want_snapshot
        )
        try:
            await self._router.publish(TOPICS.sync_requests, request)
        except RouterError as exc:
            logger.warning("sync request to %s failed: %s", self.master_id, exc)

    def _from_master(self, received: Received) -> bool:
        return received.sender == self.master_id and not self.i_am_master

    async def _on_global(self, received: Received) -> None:
        message: GlobalEvent = received.message
        if not self._from_master(received) or message.session_id != self.session_id:
            self.ignored_foreign += 1
            return
        if not self.synced:
            self._held.append(message.event)  # applied after the snapshot, if newer than it
            return
        self._buffer, ready, since = receive(self._buffer, message.event, self._clock())
        self._apply_run(ready)
        if since is not None:
            await self._request(since, want_snapshot=False)

    async def _on_sync(self, received: Received) -> None:
        reply = received.message
        if not self._from_master(received) or reply.session_id != self.session_id:
            self.ignored_foreign += 1
            return
        if isinstance(reply, SnapshotOffer):
            self._adopt_snapshot(reply)
        elif isinstance(reply, EventBurst) and self.synced:
            for event in reply.events:
                self._buffer, ready, _since = receive(self._buffer, event, self._clock())
                self._apply_run(ready)

    async def _tick(self) -> None:
        now = self._clock()
        if self.master_id is None or self.i_am_master:
            return
        if not self.synced:
            if self._snapshot_requested_at is None or now - self._snapshot_requested_at >= SNAPSHOT_RETRY_S:
                self._snapshot_requested_at = now
                await self._request(self.state.last_event_applied_idx + 1, want_snapshot=True)
            return
        self._buffer, since = on_tick(self._buffer, now)
        if since is None and self._master_high_water is not None:
            self._buffer, since = on_master_high_water(self._buffer, self._master_high_water, now)
            if since is not None:
                self.tail_requests += 1
                logger.info("trailing master %s (at idx %d, it announced %d): asking for the tail", self.master_id,
                            self.state.last_event_applied_idx, self._master_high_water)
        if since is not None:
            await self._request(since, want_snapshot=False)

    async def run(self) -> None:
        global_events = self._router.subscribe(TOPICS.global_events)
        sync_replies = self._router.subscribe(TOPICS.state_sync)  # node-addressed: ours only

        async def pump(subscription, handler) -> None:
            async for received in subscription:
                await handler(received)
                self._wake_ticker()

        async def ticker() -> None:
            while True:
                await self._tick()
                if self._needs_ticks():
                    await asyncio.sleep(TICK_S)
                    continue
                self._tick_wanted.clear()
                await self._tick_wanted.wait()

        async with asyncio.TaskGroup() as group:
            group.create_task(pump(global_events, self._on_global))
            group.create_task(pump(sync_replies, self._on_sync))
            group.create_task(ticker())

    def stats(self) -> dict[str, object]:
        return {
            "masterNodeId": self.master_id,
            "sessionId": self.session_id,
            "synced": self.synced,
            "lastEventIdx": self.state.last_event_applied_idx,
            "applied": self.applied,
            "snapshotsAdopted": self.snapshots_adopted,
            "tailRequests": self.tail_requests,
            "ignoredForeign": self.ignored_foreign,
            "bufferedEvents": len(self._buffer.pending),
            "bufferDropped": self._buffer.dropped,
            "listenerErrors": sum(self.listener_errors.values()),
            "listenerErrorsBy": dict(self.listener_errors),
        }
