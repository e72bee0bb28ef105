"""Recently departed members stay listed (unreachable, with why) for cluster diagnostics."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from skulk.observe.lost_members import LOST_MEMBER_MEMORY_S, LostMembers, departure_reason
from skulk.shared.types.events import IndexedEvent, NodeLeft, NodeTimedOut
from skulk.shared.types.state import NodeInfo, State

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def indexed(idx: int, event) -> IndexedEvent:
    return IndexedEvent(idx=idx, origin="m", indexed_at=T0, event=event)


def timed_out(node: str, cause: str = "silence") -> NodeTimedOut:
    return NodeTimedOut(event_id=f"e-{node}", node_id=node, last_event_age_s=1.0, effective_age_s=1.0,
                        timeout_s=0.5, cause=cause)


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (timed_out("n", "presence_lost"), "pruned by the master: its transport presence was lost"),
        (timed_out("n"), "pruned by the master: it fell silent"),
        (NodeLeft(event_id="e", node_id="n"), "it left the cluster (clean stop)"),
    ],
)
def test_departure_reason(event, reason):
    assert departure_reason(event) == reason


def test_a_departed_member_is_listed_until_it_returns_or_is_old():
    now = [0.0]
    lost = LostMembers(clock=lambda: now[0])
    lost.observe(indexed(0, timed_out("a", "presence_lost")))
    lost.observe(indexed(1, NodeLeft(event_id="x", node_id="b")))
    assert set(lost.recent(State())) == {"a", "b"}
    back = State(nodes={"b": NodeInfo(node_id="b", node_name="b", version="1")})
    assert set(lost.recent(back)) == {"a"}  # b rejoined: no longer listed
    now[0] = LOST_MEMBER_MEMORY_S + 1
    assert lost.recent(State()) == {}
