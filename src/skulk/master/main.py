"""The master's shell: active on the elected node only, for one session.

It seeds the session from this node's replicated State (so placed instances survive a
failover and indices continue where the cluster left off), then runs one sequential loop
over an inbox fed by: producers' LocalEvents, commands, followers' sync requests, and its
own plan tick. Every decision is a pure function (`indexer.admit`, `commands.decide`,
`plan.plan`); this module persists, applies and publishes what they return, in index order:
apply to the local replica, append to the disk log, broadcast on GLOBAL_EVENTS. A snapshot
is taken every `SNAPSHOT_EVERY_EVENTS`, so a joining node needs the snapshot plus a short
retained tail, which is replayed to it in paced bursts (`shared.sync.ReplayScheduler`).
Every instance deletion it commits is remembered for `repair.CREDIT_GRACE_S`, and its
memory is credited to placement decisions meanwhile (gossiped memory lags a teardown).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from skulk.cluster.replica import StateReplica
from skulk.datadir.event_log import DiskEventLog
from skulk.datadir.superseded_logs import Retention, prune_superseded, superseded_name
from skulk.master import indexer as ix
from skulk.master.commands import DecisionContext, Refusal, decide
from skulk.master.deferred_placements import DeferredPlacements, defer, deferrable, take_all
from skulk.master.plan import MasterView, heartbeat_warnings, plan, track_broken_groups, track_zombies
from skulk.master.presence_loss import PRESENCE_LOSS_CONFIRM_S, PresenceLedger, lost_nodes, observe, record_prunes
from skulk.master.repair import DeletionCredit, active_credits, record_deletion
from skulk.master.restore import RESTORE_DEADLINE_S, restore_step
from skulk.routing.router import Router, RouterError, TypedSubscription
from skulk.routing.topics import TOPICS
from skulk.shared.election import STALL_HOLD_AFTER_S, STALL_HOLD_S
from skulk.shared.intent import ClusterIntent, PlacementIntent, restore_cards
from skulk.shared.settings import setting
from skulk.shared.sync import due_bursts, next_due_at, replay_scheduler, request
from skulk.shared.telemetry_view import NODE_TIMEOUT_S, TelemetryView, freshness, node_resources
from skulk.shared.ticks import until_tick_s
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.commands import ForwarderCommand, GenerateText
from skulk.shared.types.events import (
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    InstancePlacementRefused,
    InstanceRepairAbandoned,
    LocalEvent,
    NodeTimedOut,
)
from skulk.shared.types.ids import InstanceId, ModelId, NodeId, SessionId, TaskId, new_id
from skulk.shared.types.state import State
from skulk.shared.types.sync import EventBurst, GlobalEvent, SnapshotOffer, SyncRequest
from skulk.shared.wire_keys import to_camel_keys

logger = logging.getLogger(__name__)

SNAPSHOT_EVERY_EVENTS = 512
"""A snapshot every this many indexed events bounds a joiner's replay to ~16 bursts."""

RETAINED_TAIL_EVENTS = 4096
"""Indexed events kept in memory for replay; must exceed SNAPSHOT_EVERY_EVENTS."""

PLAN_INTERVAL_S = 1.0
PLAN_GRACE_AFTER_PROMOTION_S = 6.0
"""No liveness verdicts until three heartbeat periods after promotion: a freshly promoted
node may not have heard every peer's heartbeat yet."""

TEST_NODE_TIMEOUT_ENV = "SKULK_TEST_NODE_TIMEOUT_SECONDS"
"""Test-only knob: when set (seconds, > 0), the master prunes a silent node after this long
instead of NODE_TIMEOUT_S, so a real-process test of node loss (kill -9, then re-placement
on the survivors) does not wait half a minute. Heartbeats come every 2 s: keep it well
above that. Never set it in production."""


def node_timeout_s(env: Mapping[str, str] = os.environ) -> float:
    """The prune timeout: NODE_TIMEOUT_S, or the test knob when it is set to a positive number."""
    raw = setting(TEST_NODE_TIMEOUT_ENV, env)
    if not raw:
        return NODE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{TEST_NODE_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{TEST_NODE_TIMEOUT_ENV}={raw!r} must be positive")
    return value


TEST_DROP_GENERATIONS_ENV = "SKULK_TEST_MASTER_DROPS_GENERATIONS"
"""Test-only knob: when set (a count, >= 0), the master ignores that many of the first
GenerateText commands it receives, as if they had been published while it was not
listening yet (a new master whose command subscription is not up). A real-process test
makes the lost-command race deterministic with it. Never set it in production."""


def dropped_generations(env: Mapping[str, str] = os.environ) -> int:
    """How many first GenerateText commands the master ignores: 0, or the test knob."""
    raw = setting(TEST_DROP_GENERATIONS_ENV, env)
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{TEST_DROP_GENERATIONS_ENV}={raw!r} is not a count") from None
    if value < 0:
        raise ValueError(f"{TEST_DROP_GENERATIONS_ENV}={raw!r} must not be negative")
    return value


REPLAY_TICK_S = 0.05
"""Shortest gap between two replay ticks while a replay request is open. With none open the
replay ticker sleeps until a SyncRequest arrives: an idle master does not wake 20 times a
second for nothing (each wake-up costs CPU that a decoding runner on the same cores feels)."""
INBOX_CAPACITY = 4096
STALL_HOLD_MAX_S = STALL_HOLD_AFTER_S + STALL_HOLD_S
"""Longest the master holds an input after a stall of this node's: the election's judgement
(its next tick) plus its hold; a newer leader heard meanwhile ends this master sooner."""
STALL_POLL_S = 0.05

PRESENCE_RECHECK_MARGIN_S = 0.05
"""A departure's extra plan passes run this long after the change reached the master's watch
(so the node's own watch, which the verdict reads, has it too) and after its hysteresis ends
(so the pass sees the absence as confirmed rather than a hair short of it)."""


class EventLogSlot:
    """The node's event log, replaceable when a new session must start a fresh log. Logs
    moved aside are kept within `retention` (pruned here at open and at each supersede)."""

    def __init__(
        self,
        directory: Path,
        open_log: Callable[[Path], DiskEventLog] = DiskEventLog,
        *,
        retention: Retention | None = None,
    ) -> None:
        self.directory = directory
        self._open = open_log
        self._retention = retention
        self._prune()
        self.log = open_log(directory)

    def _prune(self) -> None:
        if self._retention is not None:
            prune_superseded(self.directory, self._retention, time.time())

    def supersede(self) -> None:
        """Move the current log aside (its indices would collide with the new session's)."""
        self.log.close()
        aside = superseded_name(self.directory, time.time())
        try:
            self.directory.rename(aside)
            logger.warning("event log %s holds indices this session will reuse; moved it to %s", self.directory, aside)
        except OSError as exc:
            logger.error("could not move event log %s aside (%s); starting a log in place", self.directory, exc)
        self._prune()
        self.log = self._open(self.directory)

    def close(self) -> None:
        self.log.close()


@dataclass(frozen=True)
class _Tick:
    pass


@dataclass(frozen=True)
class _ReplayTick:
    pass


class Master:
    def __init__(
        self,
        router: Router,
        replica: StateReplica,
        log_slot: EventLogSlot,
        telemetry: Callable[[], TelemetryView],
        *,
        session_id: str,
        cards: Callable[[], Mapping[ModelId, ModelCard]] = dict,
        presence: Callable[[], frozenset[str]] | None = None,
        intent: Callable[[], ClusterIntent] | None = None,
        ready_to_index: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._intent = intent
        """The operator's remembered intent (this node's record); restored on a cold start."""
        self._ready_to_index = ready_to_index
        """False while a stall of this node's (stopped, starved) awaits the election's judgement
        or its hold runs (`ElectionService.may_index`): a leader back from a stall may have
        been replaced; nothing is indexed in its stale session until it hears so or the hold
        ends."""
        self._restoring: list[PlacementIntent] = []
        self._restore_reasons: dict[str, str] = {}
        self._cards = cards
        self._presence = presence
        """The nodes holding a presence token now, from a watch older than this master (a
        fresh watch reports nobody until its history arrives); None: no presence verdicts."""
        self._presence_ledger = PresenceLedger()
        self._router = router
        self._replica = replica
        self._slot = log_slot
        self._telemetry = telemetry
        self.session_id = SessionId(session_id)
        self._clock = clock
        self._node_timeout_s = node_timeout_s()
        self._generations_to_drop = dropped_generations()
        self._indexer: ix.Indexer | None = None
        self._tail: deque[IndexedEvent] = deque(maxlen=RETAINED_TAIL_EVENTS)
        self._snapshot: tuple[int, State] = (-1, State())
        self._replay = replay_scheduler()
        self._replay_requested = asyncio.Event()
        """Set when a replay request opens; the replay ticker waits on it while none is open."""
        self._zombie_since: dict[TaskId, float] = {}
        self._broken_since: dict[InstanceId, float] = {}
        self._deletion_credits: tuple[DeletionCredit, ...] = ()
        self._warned: frozenset[NodeId] = frozenset()
        self._promoted_at = clock()
        self.indexed = 0
        self.stall_holds = 0
        """Inputs held while a stall of this node's was judged or held (diagnostics)."""
        self.refused_commands = 0
        self._deferred = DeferredPlacements()
        self.snapshots_sent = 0
        self.bursts_sent = 0

    @property
    def me(self) -> NodeId:
        return NodeId(self._router.node_id)

    # -- seeding ----------------------------------------------------------------------------

    def _seed(self) -> None:
        state = self._replica.state
        if state.last_event_applied_idx < 0 and self._intent is not None:
            # A cold start: no node of this cluster holds any State. Restore the intent.
            self._restoring = list(self._intent().placements.values())
        next_idx = state.last_event_applied_idx + 1
        log_last = self._slot.log.last_idx
        if log_last is not None and log_last >= next_idx:
            self._slot.supersede()
        self._indexer = ix.new_indexer(next_idx)
        self._snapshot = (state.last_event_applied_idx, state)
        self._write_snapshot_soon(state)
        logger.info("master %s session %s starts at idx %d", self.me, self.session_id, next_idx)

    def _write_snapshot_soon(self, state: State) -> None:
        if state.last_event_applied_idx < 0:
            return
        idx = state.last_event_applied_idx
        wire = state.to_wire()

        def write() -> None:
            log = self._slot.log
            if log.last_idx is None or idx > log.last_idx:
                return  # the log never saw these indices (fresh log after a failover)
            if log.write_snapshot(idx, wire):
                log.compact_before(idx)

        asyncio.get_running_loop().run_in_executor(None, write)

    # -- committing -------------------------------------------------------------------------

    async def _commit(self, events: list[IndexedEvent]) -> None:
        for event in events:
            if isinstance(event.event, InstancePlacementRefused):
                logger.warning("node %s refused its shard of instance %s: %s; re-placing",
                               event.event.node_id, event.event.instance_id, event.event.message)
            elif isinstance(event.event, InstanceCreated) and event.event.instance.repair_hop > 0:
                repaired = event.event.instance
                logger.warning("re-placed %s as instance %s at repair hop %d on nodes %s", repaired.model_id,
                               repaired.instance_id, repaired.repair_hop, ",".join(repaired.node_ids()))
            elif isinstance(event.event, InstanceRepairAbandoned):
                logger.error("gave up repairing %s (instance %s, hop %d): %s", event.event.model_id,
                             event.event.instance_id, event.event.repair_hop, event.event.reason)
            if isinstance(event.event, InstanceDeleted):
                self._deletion_credits = record_deletion(
                    self._deletion_credits, self._replica.state, event.event.instance_id, self._cards(), self._clock()
                )
            self._replica.apply_indexed(event)
            self._slot.log.append(event.to_wire())
            self._tail.append(event)
            self.indexed += 1
            try:
                await self._router.publish(TOPICS.global_events, GlobalEvent(session_id=self.session_id, event=event))
            except RouterError as exc:
                logger.warning("broadcast of event %d failed (followers will ask for it): %s", event.idx, exc)
        if self._replica.state.last_event_applied_idx - self._snapshot[0] >= SNAPSHOT_EVERY_EVENTS:
            state = self._replica.state
            self._snapshot = (state.last_event_applied_idx, state)
            self._write_snapshot_soon(state)

    def _seeded_indexer(self) -> ix.Indexer:
        """The indexer `_seed` made: every input is handled after `run` seeds it."""
        assert self._indexer is not None, "master used before run() seeded it"
        return self._indexer

    async def _index_own(self, events: list[Event]) -> None:
        if not events:
            return
        self._indexer, indexed = ix.index_own(self._seeded_indexer(), events, self.me, datetime.now(UTC))
        await self._commit(indexed)

    # -- inputs -----------------------------------------------------------------------------

    async def _on_local_event(self, local: LocalEvent) -> None:
        self._indexer, indexed = ix.admit(self._seeded_indexer(), local, datetime.now(UTC))
        await self._commit(indexed)

    async def _on_command(self, forwarded: ForwarderCommand) -> None:
        if self._generations_to_drop and isinstance(forwarded.command, GenerateText):
            self._generations_to_drop -= 1  # the test knob: this one was "never received"
            logger.warning("test knob %s: ignoring command %s", TEST_DROP_GENERATIONS_ENV, forwarded.command.command_id)
            return
        await self._decide_command(forwarded, first_refused_at=None)

    async def _decide_command(self, forwarded: ForwarderCommand, first_refused_at: float | None) -> None:
        state = self._replica.state
        context = DecisionContext(
            new_id=new_id,
            origin=forwarded.origin,
            cards=self._cards(),
            resources=node_resources(self._telemetry(), state),
            memory_credits=active_credits(self._deletion_credits, self._clock()),
        )
        decision = decide(state, forwarded.command, context)
        if isinstance(decision, Refusal):
            if deferrable(forwarded, decision.code):
                self._hold_placement(forwarded, decision.message, first_refused_at)
                return
            self.refused_commands += 1
            logger.info("refused %s from %s: %s", type(forwarded.command).__name__, forwarded.origin, decision.message)
            return
        await self._index_own(decision)

    def _hold_placement(self, forwarded: ForwarderCommand, reason: str, first_refused_at: float | None) -> None:
        """`deferred_placements`: decided again on the next plan ticks, within its deadline."""
        self._deferred, dropped = defer(self._deferred, forwarded, reason, self._clock(), first_refused_at)
        if first_refused_at is None and (dropped is None or dropped.forwarded is not forwarded):
            logger.info("holding %s from %s until cluster info arrives: %s", type(forwarded.command).__name__,
                        forwarded.origin, reason)
        if dropped is not None:
            self.refused_commands += 1
            logger.warning("refused %s from %s: %s (held %.0f s)", type(dropped.forwarded.command).__name__,
                           dropped.forwarded.origin, dropped.reason, self._clock() - dropped.first_refused_at)

    async def _retry_deferred(self) -> None:
        self._deferred, held = take_all(self._deferred)
        for entry in held:
            await self._decide_command(entry.forwarded, first_refused_at=entry.first_refused_at)

    async def _on_sync_request(self, req: SyncRequest) -> None:
        if req.session_id != self.session_id:
            return
        tail_start = self._tail[0].idx if self._tail else self._replica.state.last_event_applied_idx + 1
        snapshot_idx, snapshot_state = self._snapshot
        if req.want_snapshot or req.since_idx < tail_start:
            offer = SnapshotOffer(session_id=self.session_id, high_water_idx=snapshot_idx, state=snapshot_state)
            await self._send(req.node_id, offer)
            self.snapshots_sent += 1
            since = snapshot_idx + 1
        else:
            since = req.since_idx
        self._replay = request(self._replay, req.node_id, since)
        self._replay_requested.set()

    async def _on_replay_tick(self) -> None:
        last = self._replica.state.last_event_applied_idx
        self._replay, bursts = due_bursts(self._replay, self._clock(), last)
        tail_start = self._tail[0].idx if self._tail else last + 1
        for node_id, start, end in bursts:
            if start < tail_start:  # evicted from memory meanwhile: start over from the snapshot
                await self._on_sync_request(SyncRequest(node_id=NodeId(node_id), session_id=self.session_id, since_idx=start,
                                                        want_snapshot=True))
                continue
            events = [e for e in self._tail if start <= e.idx < end]
            if events:
                await self._send(node_id, EventBurst(session_id=self.session_id, events=events))
                self.bursts_sent += 1

    async def _hold_while_stalled(self) -> None:
        """Wait, at most STALL_HOLD_MAX_S, until the election has judged a stall of this node's
        (after which this task is cancelled if the node stepped down)."""
        if self._ready_to_index():
            return
        self.stall_holds += 1
        deadline = self._clock() + STALL_HOLD_MAX_S
        while not self._ready_to_index() and self._clock() < deadline:
            await asyncio.sleep(STALL_POLL_S)

    async def _send(self, node_id: str, message: Any) -> None:
        try:
            await self._router.publish(TOPICS.state_sync, message, to_node=node_id)
        except RouterError as exc:
            logger.warning("state sync to %s failed: %s", node_id, exc)

    async def _on_plan_tick(self) -> None:
        # A producer gap open too long (its message was dropped) is skipped, not waited on.
        self._indexer, released = ix.release_stale(self._seeded_indexer(), datetime.now(UTC))
        await self._commit(released)
        await self._retry_deferred()
        now = self._clock()
        state = self._replica.state
        presence_lost: dict[NodeId, float] = {}
        if self._presence is not None:
            self._presence_ledger = observe(self._presence_ledger, state.nodes, self._presence(), self.me, now)
            presence_lost = lost_nodes(self._presence_ledger, now)
        # Presence verdicts need no grace (the node's presence watch predates this master);
        # liveness verdicts do: a freshly promoted node may not have heard every heartbeat.
        in_grace = now - self._promoted_at < PLAN_GRACE_AFTER_PROMOTION_S
        if in_grace and not presence_lost:
            return
        view_telemetry = self._telemetry()
        now_utc = datetime.now(UTC)
        fresh = {} if in_grace else {
            node: freshness(view_telemetry, state, node, now, now_utc) for node in state.nodes if node != self.me
        }
        newly_late, recovered = heartbeat_warnings(fresh, self._warned)
        for node in sorted(newly_late):
            logger.warning("no heartbeat from node %s for %.0f s", node, fresh[node].heartbeat_age_s or -1)
        for node in sorted(recovered):
            logger.info("heartbeats from node %s resumed", node)
        self._warned = ((self._warned | newly_late) - recovered) & frozenset(fresh)
        self._zombie_since = track_zombies(state, self._zombie_since, now)
        self._broken_since = track_broken_groups(state, self._broken_since, now)
        view = MasterView(
            state=state, me=self.me, freshness=fresh, zombie_since=self._zombie_since, now=now,
            cards=self._cards(), resources=node_resources(view_telemetry, state),
            memory_credits=active_credits(self._deletion_credits, now), node_timeout_s=self._node_timeout_s,
            broken_since=self._broken_since, presence_lost=presence_lost,
        )
        events = plan(view, new_id)
        pruned = [e.node_id for e in events if isinstance(e, NodeTimedOut) and e.cause == "presence_lost"]
        for event in events:
            if isinstance(event, NodeTimedOut):
                logger.warning("pruned node %s: %s %.1f s", event.node_id,
                               "presence gone for" if event.cause == "presence_lost" else "silent for",
                               event.effective_age_s)
        self._presence_ledger = record_prunes(self._presence_ledger, pruned, now)
        for event in events:  # a plan's InstanceCreated is always a repair; hop > 0 logs at commit
            if isinstance(event, InstanceCreated) and event.instance.repair_hop == 0:
                logger.warning("re-placed %s as instance %s on nodes %s", event.instance.model_id,
                               event.instance.instance_id, ",".join(event.instance.node_ids()))
        await self._index_own(events)
        if self._restoring and not events and not in_grace:
            await self._restore_some(now)

    async def _restore_some(self, now: float) -> None:
        """One remembered placement per pass, on the nodes that came back (see restore)."""
        waited_s = now - self._promoted_at
        state = self._replica.state
        step = restore_step(self._restoring, state, self._cards(), node_resources(self._telemetry(), state),
                            waited_s=waited_s, new_id=new_id,
                            memory_credits=active_credits(self._deletion_credits, now))
        self._restoring = [wanted for wanted, _reason in step.waiting]
        for wanted, reason in step.waiting:
            if self._restore_reasons.get(wanted.model_id) != reason:
                logger.info("restoring %s waits: %s", wanted.model_id, reason)
                self._restore_reasons[wanted.model_id] = reason
        if step.created is not None:
            instance = step.created.instance
            logger.warning("cold start: restored %s as instance %s on nodes %s", instance.model_id,
                           instance.instance_id, ",".join(instance.node_ids()))
            await self._index_own([step.created])
        if self._restoring and waited_s >= RESTORE_DEADLINE_S:
            for wanted in self._restoring:
                logger.error("cold start: gave up restoring %s after %.0f s: %s", wanted.model_id, waited_s,
                             self._restore_reasons.get(wanted.model_id, "it fits no node"))
            self._restoring = []

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        self._seed()
        if self._intent is not None and self._replica.state.last_event_applied_idx < 0:
            cards = restore_cards(self._intent(), self._replica.state, new_id)
            if cards or self._restoring:
                logger.warning("cold start: restoring %d custom card(s) and %d placement(s) from the intent record",
                               len(cards), len(self._restoring))
            await self._index_own(cards)
        if self._presence is not None:  # absences are timed from promotion, not the first tick
            state = self._replica.state
            self._presence_ledger = observe(self._presence_ledger, state.nodes, self._presence(), self.me, self._clock())
        inbox: asyncio.Queue[object] = asyncio.Queue(maxsize=INBOX_CAPACITY)
        # The master's receive queues are as deep as its inbox: a burst of commands waits
        # here rather than being dropped while the loop commits.
        local_events = self._router.subscribe(TOPICS.local_events, maxsize=INBOX_CAPACITY)
        commands = self._router.subscribe(TOPICS.commands, maxsize=INBOX_CAPACITY)
        sync_requests = self._router.subscribe(TOPICS.sync_requests)
        presence_changes = self._router.watch_presence() if self._presence is not None else None

        async def pump(subscription: TypedSubscription[Any]) -> None:
            async for received in subscription:
                message = received.message
                if isinstance(message, LocalEvent) and message.origin != received.sender:
                    continue  # a node submits only its own events
                if isinstance(message, SyncRequest) and message.node_id != received.sender:
                    continue
                await inbox.put(message)

        async def plan_soon_after_departures() -> None:
            """A departure (or a member already absent at promotion) is judged once its
            hysteresis has passed, not at the next tick."""
            assert presence_changes is not None
            await asyncio.sleep(PRESENCE_LOSS_CONFIRM_S + PRESENCE_RECHECK_MARGIN_S)
            await inbox.put(_Tick())
            async for change in presence_changes:
                if not change.alive:
                    # Stamp the absence now, not at the next tick: a moment later, so the
                    # node's own presence watch (which the verdict reads) has seen it too.
                    await asyncio.sleep(PRESENCE_RECHECK_MARGIN_S)
                    await inbox.put(_Tick())
                    await asyncio.sleep(PRESENCE_LOSS_CONFIRM_S + PRESENCE_RECHECK_MARGIN_S)
                    await inbox.put(_Tick())

        async def every(interval_s: float, item: object) -> None:
            loop = asyncio.get_running_loop()
            while True:
                await asyncio.sleep(until_tick_s(loop.time(), interval_s))  # on the tick grid (`shared.ticks`)
                await inbox.put(item)

        async def replay_ticks() -> None:
            """A replay tick when a burst is due (at most every REPLAY_TICK_S), none while no
            replay request is open."""
            while True:
                due = next_due_at(self._replay, self._clock())
                if due is None:
                    self._replay_requested.clear()
                    await self._replay_requested.wait()
                    continue
                await asyncio.sleep(max(due - self._clock(), REPLAY_TICK_S))
                await inbox.put(_ReplayTick())

        handlers: dict[type, Callable[[Any], Awaitable[None]]] = {
            LocalEvent: self._on_local_event,
            ForwarderCommand: self._on_command,
            SyncRequest: self._on_sync_request,
            _Tick: lambda _item: self._on_plan_tick(),
            _ReplayTick: lambda _item: self._on_replay_tick(),
        }
        try:
            async with asyncio.TaskGroup() as group:
                for subscription in (local_events, commands, sync_requests):
                    group.create_task(pump(subscription))
                group.create_task(every(PLAN_INTERVAL_S, _Tick()))
                group.create_task(replay_ticks())
                if presence_changes is not None:
                    group.create_task(plan_soon_after_departures())
                while True:
                    item = await inbox.get()
                    await self._hold_while_stalled()
                    await handlers[type(item)](item)
        finally:
            for subscription in (local_events, commands, sync_requests):
                subscription.close()
            if presence_changes is not None:
                presence_changes.close()

    def stats(self) -> dict[str, object]:
        return {
            "sessionId": self.session_id,
            "indexed": self.indexed,
            "stallHolds": self.stall_holds,
            "nextIdx": self._indexer.next_idx if self._indexer else None,
            "retainedTail": len(self._tail),
            "snapshotIdx": self._snapshot[0],
            "refusedCommands": self.refused_commands,
            "deferredPlacements": len(self._deferred.held),
            "deferredPlacementsDropped": self._deferred.dropped,
            "memoryCredits": active_credits(self._deletion_credits, self._clock()),
            "snapshotsSent": self.snapshots_sent,
            "burstsSent": self.bursts_sent,
            "presenceAbsent": sorted(self._presence_ledger.absent_since),
            "presencePrunes": {n: len(t) for n, t in sorted(self._presence_ledger.pruned_at.items())},
            "restoringPlacements": sorted(p.model_id for p in self._restoring),
            "indexer": to_camel_keys(self._indexer.stats()) if self._indexer else None,
        }
