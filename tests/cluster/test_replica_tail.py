"""A follower that missed the tail of a burst (no later event reveals the gap) learns it from
its master's announcement and asks for the tail (`shared.sync.on_master_high_water`, table-
tested in tests/shared/test_sync.py); announcements of another master or session, or one it
is in step with, ask nothing."""

from __future__ import annotations

import asyncio

from skulk.cluster.replica import StateReplica
from skulk.shared.sync import TAIL_LAG_S
from skulk.shared.types.election import ElectionMessage
from skulk.shared.types.state import State
from skulk.shared.types.sync import SnapshotOffer, SyncRequest


class RecordingRouter:
    node_id = "f"

    def __init__(self) -> None:
        self.published: list[object] = []

    async def publish(self, topic: object, message: object, to_node: str | None = None) -> None:
        self.published.append(message)


def leader(node_id: str = "m", session_id: str = "m.1", high_water_idx: int = 3) -> ElectionMessage:
    return ElectionMessage(kind="leader", node_id=node_id, clock=1, seniority=1, commands_seen=0,
                           session_id=session_id, high_water_idx=high_water_idx)


def synced_follower(clock: list[float]) -> tuple[StateReplica, RecordingRouter]:
    router = RecordingRouter()
    replica = StateReplica(router, clock=lambda: clock[0])  # type: ignore[arg-type]
    replica.adopt_session("m", "m.1", i_am_master=False)  # type: ignore[arg-type]
    replica._adopt_snapshot(SnapshotOffer(session_id="m.1", high_water_idx=-1, state=State()))
    return replica, router


def requests(router: RecordingRouter) -> list[int]:
    return [m.since_idx for m in router.published if isinstance(m, SyncRequest) and not m.want_snapshot]


def test_a_missed_tail_is_asked_for_after_the_lag() -> None:
    clock = [100.0]
    replica, router = synced_follower(clock)
    replica.heard_leader(leader(high_water_idx=3))
    asyncio.run(replica._tick())
    assert requests(router) == []  # the events may still be on their way
    clock[0] += TAIL_LAG_S
    asyncio.run(replica._tick())
    assert requests(router) == [0] and replica.stats()["tailRequests"] == 1


def test_announcements_of_another_master_or_in_step_ask_nothing() -> None:
    clock = [100.0]
    replica, router = synced_follower(clock)
    for message in (leader(node_id="x"), leader(session_id="m.0"), leader(high_water_idx=-1)):
        replica.heard_leader(message)
        asyncio.run(replica._tick())
        clock[0] += TAIL_LAG_S
        asyncio.run(replica._tick())
    assert requests(router) == []
