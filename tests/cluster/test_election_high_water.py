"""A leader stamps its announcements with its last indexed event; candidacies carry none."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from skulk.cluster.election import ElectionService
from skulk.shared import election as machine
from skulk.shared.types.election import ElectionMessage


class RecordingRouter:
    node_id = "b"

    def __init__(self) -> None:
        self.published: list[ElectionMessage] = []

    def deaf_for_s(self) -> float:
        return 0.0

    async def publish(self, topic: object, message: ElectionMessage) -> None:
        self.published.append(message)


def test_a_leaders_announcements_carry_its_high_water_mark() -> None:
    router = RecordingRouter()
    clock = [0.0]
    service = ElectionService(router, commands_seen=lambda: 0, members=lambda: frozenset({"b"}),  # pyright: ignore[reportArgumentType]
                              on_elected=lambda _e: None, high_water=lambda: 7, clock=lambda: clock[0])
    for _ in range(40):  # a lone node campaigns and wins within a few windows
        clock[0] += machine.CAMPAIGN_WINDOW_S / 4
        asyncio.run(service._step(machine.Tick()))
        if machine.is_leading(service.view) and any(m.kind == "leader" for m in router.published):
            break
    leaders = [m for m in router.published if m.kind == "leader"]
    assert leaders and all(m.high_water_idx == 7 for m in leaders)
    assert all(m.high_water_idx is None for m in router.published if m.kind == "candidate")


def test_a_candidacy_may_not_carry_a_high_water_mark() -> None:
    with pytest.raises(ValidationError, match="high_water_idx"):
        ElectionMessage(kind="candidate", node_id="a", clock=1, seniority=0, commands_seen=0, high_water_idx=3)
