"""A placement refused only because cluster info is pending is held, decided again, and
dropped after its deadline or at the bound; nothing else is held."""

import pytest

from skulk.master.deferred_placements import (
    DEFER_DEADLINE_S,
    MAX_DEFERRED_PLACEMENTS,
    DeferredPlacements,
    defer,
    deferrable,
    take_all,
)
from skulk.shared.types.commands import DeleteInstance, ForwarderCommand, PlaceInstance


def placement(command_id: str = "c1", instance_id: str | None = "i1") -> ForwarderCommand:
    return ForwarderCommand(origin="n1", command=PlaceInstance(command_id=command_id, model_id="local/tiny-llama",
                                                               instance_id=instance_id))


@pytest.mark.parametrize(("forwarded", "code", "expected"), [
    (placement(), "placement_info_pending", True),
    (placement(), "memory_shortfall", False),  # a lasting reason: refused at once
    (placement(instance_id=None), "placement_info_pending", False),  # nobody was promised an id
    (ForwarderCommand(origin="n1", command=DeleteInstance(command_id="c", instance_id="i1")),
     "placement_info_pending", False),
])
def test_deferrable(forwarded, code, expected):
    assert deferrable(forwarded, code) is expected


def test_a_held_placement_keeps_its_first_refusal_time_until_the_deadline():
    held, dropped = defer(DeferredPlacements(), placement(), "waiting for node resources", now=10.0)
    assert dropped is None and [d.first_refused_at for d in held.held] == [10.0]
    held, retry = take_all(held)
    assert held.held == () and [d.forwarded for d in retry] == [placement()]
    held, dropped = defer(held, retry[0].forwarded, "still waiting", now=20.0, first_refused_at=retry[0].first_refused_at)
    assert dropped is None and [(d.first_refused_at, d.reason) for d in held.held] == [(10.0, "still waiting")]
    _, retry = take_all(held)
    held, dropped = defer(DeferredPlacements(), retry[0].forwarded, "still waiting", now=10.0 + DEFER_DEADLINE_S,
                          first_refused_at=10.0)
    assert held.held == () and dropped is not None and dropped.forwarded == placement()


def test_the_same_command_is_held_once():
    held, _ = defer(DeferredPlacements(), placement(), "a", now=1.0)
    held, _ = defer(held, placement(), "b", now=2.0)
    assert [d.reason for d in held.held] == ["b"]


def test_the_oldest_is_dropped_at_the_bound_and_counted():
    held = DeferredPlacements()
    for n in range(MAX_DEFERRED_PLACEMENTS):
        held, dropped = defer(held, placement(f"c{n}", f"i{n}"), "pending", now=float(n))
        assert dropped is None
    held, dropped = defer(held, placement("last", "last"), "pending", now=100.0 - DEFER_DEADLINE_S)
    assert dropped is not None and dropped.forwarded.command.command_id == "c0"
    assert len(held.held) == MAX_DEFERRED_PLACEMENTS and held.dropped == 1
    assert held.held[-1].forwarded.command.command_id == "last"
