"""Runs the pure election machine (`skulk.shared.election`) against the network.

Feeds it election messages, presence changes and ticks; publishes what it asks to
broadcast; reports each new (master, session) to the node. Commands seen are approximated
by events applied (`commands_seen` callable): the node with the most history wins a tie.
`members` (the replicated State's member ids) is what a campaign needs a majority of; the
router's `deaf_for_s` (it hears none of its present peers, `routing/hearing.py`) keeps a
deaf node from deciding and makes a deaf leader step down. The tick comes when the
machine's next timed rule may be due (`next_tick_in_s`: about once a second for an idle
leader or follower), on the process's tick grid (`shared.ticks`, TICK_S apart); how late
the ticker wakes past its instant is the node's own stall: a leader back from one holds its
indexing for a while (`machine.stall_hold_until`), and `may_index` tells the master so
(also while a stall is waiting for the next tick to be judged).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from skulk.routing.router import Router, RouterError
from skulk.routing.topics import TOPICS
from skulk.shared import election as machine
from skulk.shared.ticks import next_tick_at
from skulk.shared.types.election import ElectionMessage

logger = logging.getLogger(__name__)

TICK_S = 0.25
"""The grid the ticker wakes on: each timed rule fires within this long after its time."""


class ElectionService:
    def __init__(
        self,
        router: Router,
        *,
        commands_seen: Callable[[], int],
        members: Callable[[], frozenset[str]] = frozenset,
        on_elected: Callable[[machine.Elected], None],
        on_demoted: Callable[[], None] = lambda: None,
        high_water: Callable[[], int] | None = None,
        on_leader_heard: Callable[[ElectionMessage], None] = lambda _message: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._high_water = high_water
        """This node's last indexed event, stamped on its leader announcements (None: not stamped)."""
        self._on_leader_heard = on_leader_heard
        """Every leader announcement heard (the replica reads its master's high-water mark)."""
        self._router = router
        self._commands_seen = commands_seen
        self._members = members
        self._on_elected = on_elected
        self._on_demoted = on_demoted
        self._clock = clock
        self.view = machine.initial_view(clock())
        self.seniority = 0
        self.elections_seen = 0
        self._ticked_at: float | None = None
        self._stalled_s = 0.0
        self._hold_until: float | None = None
        self.stalls_held = 0
        self._rearm = asyncio.Event()
        """Set after a step on a message or a presence change: the ticker plans its next tick anew."""

    def _me(self) -> machine.Me:
        return machine.Me(node_id=self._router.node_id, seniority=self.seniority, commands_seen=self._commands_seen(),
                          members=self._members(), deaf_for_s=self._router.deaf_for_s())

    def may_index(self) -> bool:
        """The master may index now: the election stepped a tick within STALL_HOLD_AFTER_S (no
        stall of this node's is waiting to be judged) and no stall hold is running."""
        now = self._clock()
        if self._ticked_at is None or now - self._ticked_at >= machine.STALL_HOLD_AFTER_S:
            return False
        return self._hold_until is None or now >= self._hold_until

    async def _step(self, event: machine.Input) -> None:
        was_leading = machine.is_leading(self.view)
        now = self._clock()
        if isinstance(event, machine.Tick):
            hold = machine.stall_hold_until(self.view, self._stalled_s, self._me(), now)
            if hold is not None:
                self.stalls_held += 1
                self._hold_until = hold
                logger.warning("this node stalled for %.1f s (stopped or starved) while leading: indexing nothing "
                               "for %.0f s, in case the others elected a master meanwhile",
                               self._stalled_s, machine.STALL_HOLD_S)
            self._ticked_at, self._stalled_s = now, 0.0
        self.view, actions = machine.step(self.view, event, self._me(), now)
        if was_leading and not machine.is_leading(self.view):
            # Only a leading node may index: stop at once, before the next campaign ends.
            logger.info("no longer leading (phase %s)", self.view.phase)
            self._on_demoted()
        for action in actions:
            if isinstance(action, machine.Broadcast):
                message = action.message
                if message.kind == "leader" and self._high_water is not None:
                    message = message.model_copy(update={"high_water_idx": self._high_water()})
                try:
                    await self._router.publish(TOPICS.election, message)
                except RouterError as exc:
                    logger.warning("election broadcast failed: %s", exc)
            elif isinstance(action, machine.Elected):
                self.elections_seen += 1
                if action.i_am_master:
                    self.seniority += 1
                logger.info(
                    "elected master %s (session %s, clock %d)%s",
                    action.master_id, action.session_id, action.clock, " - this node" if action.i_am_master else "",
                )
                self._on_elected(action)

    async def run(self) -> None:
        messages = self._router.subscribe(TOPICS.election, own=False)  # our broadcasts need no echo
        presence = self._router.watch_presence()
        me = self._router.node_id
        inbox: asyncio.Queue[machine.Input] = asyncio.Queue(maxsize=1024)

        async def pump_messages() -> None:
            async for received in messages:
                message: ElectionMessage = received.message
                if received.sender != message.node_id or message.node_id == me:
                    continue  # a node speaks only for itself; our own broadcasts echo back
                if message.kind == "leader":
                    self._on_leader_heard(message)
                await inbox.put(machine.Received(message))

        async def pump_presence() -> None:
            async for _change in presence:
                await inbox.put(machine.PresenceChanged(frozenset(presence.alive()) - {me}))

        async def ticker() -> None:
            loop = asyncio.get_running_loop()
            woke = self._clock()
            while True:
                # When the machine's next timed rule may be due (`next_tick_in_s`), on the
                # first instant of the process's tick grid after it (`shared.ticks`: the other
                # periodic loops wake with it); sooner when another input moved a deadline.
                self._rearm.clear()
                wait_s = machine.next_tick_in_s(self.view, self._me(), self._clock())
                delay_s = next_tick_at(loop.time() + wait_s, TICK_S) - loop.time()
                due = self._clock() + delay_s
                try:
                    async with asyncio.timeout(delay_s):
                        await self._rearm.wait()
                    woke = self._clock()
                    continue  # the view changed: plan the next tick anew
                except TimeoutError:
                    pass
                # Waking late is this node's own stall (stopped, starved, or a blocked loop);
                # the next Tick step judges it (`machine.stall_hold_until`). Late past the
                # instant slept to, or (a stop between two sleeps) a gap since the last wake
                # longer than the sleep planned.
                now = self._clock()
                self._stalled_s = max(self._stalled_s, now - due, now - woke - delay_s)
                woke = now
                await inbox.put(machine.Tick())

        async def consume() -> None:
            while True:
                event = await inbox.get()
                await self._step(event)
                if not isinstance(event, machine.Tick):
                    self._rearm.set()

        async with asyncio.TaskGroup() as group:
            for coro in (pump_messages(), pump_presence(), ticker(), consume()):
                group.create_task(coro)

    def stats(self) -> dict[str, object]:
        return {
            "phase": self.view.phase,
            "clock": self.view.clock,
            "masterNodeId": self.view.master_id,
            "sessionId": self.view.session_id,
            "seniority": self.seniority,
            "elections": self.elections_seen,
            "deafForS": round(self._router.deaf_for_s(), 1),
            "stallsHeld": self.stalls_held,
        }
