"""A State listener's exception is isolated: logged, counted, and the replica carries on."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from skulk.cluster.replica import StateReplica
from skulk.shared.types.events import IndexedEvent, NodeJoined


def _event(idx: int) -> IndexedEvent:
    return IndexedEvent(idx=idx, origin="m", indexed_at=datetime.now(UTC),
                        event=NodeJoined(event_id=f"e{idx}", node_id=f"n{idx}", node_name="x", version="1"))


def test_a_failing_listener_is_counted_and_the_others_still_run(caplog) -> None:  # type: ignore[no-untyped-def]
    replica = StateReplica(SimpleNamespace(node_id="me"))  # type: ignore[arg-type]  # apply_indexed never routes
    seen: list[int] = []

    def broken(event: IndexedEvent) -> None:
        raise RuntimeError(f"bug at {event.idx}")

    replica.on_applied(broken)
    replica.on_applied(lambda event: seen.append(event.idx))
    replica.apply_indexed(_event(0))
    replica.apply_indexed(_event(1))

    assert seen == [0, 1]  # the listener after the broken one saw every event
    assert replica.state.last_event_applied_idx == 1 and set(replica.state.nodes) == {"n0", "n1"}
    name = broken.__qualname__
    assert replica.listener_errors == {name: 2}
    assert replica.stats()["listenerErrors"] == 2 and replica.stats()["listenerErrorsBy"] == {name: 2}
    assert "bug at 1" in caplog.text


def test_a_failing_synced_listener_is_isolated_too() -> None:
    replica = StateReplica(SimpleNamespace(node_id="me"))  # type: ignore[arg-type]
    calls: list[str] = []
    replica.on_synced(lambda: (_ for _ in ()).throw(ValueError("boom")))
    replica.on_synced(lambda: calls.append("second"))
    replica.adopt_session("me", "s1", i_am_master=True)
    assert calls == ["second"] and sum(replica.listener_errors.values()) == 1
