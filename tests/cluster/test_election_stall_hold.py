"""The election shell's stall hold (`ElectionService.may_index`), with a stand-in router and a
fake clock: a leader whose tick came STALL_HOLD_AFTER_S late lets its master index nothing for
STALL_HOLD_S (the rule itself is `skulk.shared.election.stall_hold_until`, table-tested)."""

from __future__ import annotations

import asyncio

from skulk.cluster.election import TICK_S, ElectionService
from skulk.shared import election as machine
from skulk.shared.types.election import ElectionMessage


class StandInRouter:
    node_id = "b"

    def deaf_for_s(self) -> float:
        return 0.0

    async def publish(self, topic: object, message: object) -> None:
        pass


def leading_service(clock: list[float]) -> ElectionService:
    service = ElectionService(StandInRouter(), commands_seen=lambda: 0,  # pyright: ignore[reportArgumentType]
                              members=lambda: frozenset({"a", "b", "c"}), on_elected=lambda _e: None,
                              clock=lambda: clock[0])
    candidate = ElectionMessage(kind="candidate", node_id="a", clock=2, seniority=0, commands_seen=0)
    view, _ = machine.step(service.view, machine.Received(candidate), service._me(), 0.0)
    service.view, _ = machine.step(view, machine.Tick(), service._me(), machine.CAMPAIGN_WINDOW_S)
    assert machine.is_leading(service.view)
    return service


def test_a_leader_back_from_a_stall_holds_its_indexing_then_resumes() -> None:
    clock = [10.0]
    service = leading_service(clock)
    assert not service.may_index()  # no tick judged yet
    asyncio.run(service._step(machine.Tick()))
    assert service.may_index()
    clock[0] = 20.0
    assert not service.may_index()  # ticks stopped: a stall awaits its judgement
    service._stalled_s = machine.STALL_HOLD_AFTER_S
    asyncio.run(service._step(machine.Tick()))
    assert (service.may_index(), service.stalls_held) == (False, 1)
    clock[0] = 20.0 + machine.STALL_HOLD_S - TICK_S
    asyncio.run(service._step(machine.Tick()))
    assert not service.may_index()
    clock[0] = 20.0 + machine.STALL_HOLD_S
    asyncio.run(service._step(machine.Tick()))
    assert service.may_index()
    assert service.stats()["stallsHeld"] == 1


def test_a_short_stall_holds_nothing() -> None:
    clock = [10.0]
    service = leading_service(clock)
    service._stalled_s = machine.STALL_HOLD_AFTER_S - TICK_S
    asyncio.run(service._step(machine.Tick()))
    assert service.may_index() and service.stalls_held == 0
