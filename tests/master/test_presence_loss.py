"""Presence-loss verdicts: hysteresis against a blinking token, a bounded prune rate per node."""

from __future__ import annotations

import pytest

from skulk.master.presence_loss import (
    MAX_PRESENCE_PRUNES,
    PRESENCE_LOSS_CONFIRM_S,
    PRUNE_WINDOW_S,
    PresenceLedger,
    lost_nodes,
    observe,
    record_prunes,
)

ME = "m"
MEMBERS = ("m", "a", "b")


@pytest.mark.parametrize(
    ("absent_since", "alive", "now", "expected"),
    [
        ({}, {"m", "a", "b"}, 10.0, {}),  # everyone present
        ({}, {"m", "b"}, 10.0, {"a": 10.0}),  # a just went: absent from now
        ({"a": 7.0}, {"m", "b"}, 10.0, {"a": 7.0}),  # still gone: keeps its first-seen time
        ({"a": 7.0}, {"m", "a", "b"}, 10.0, {}),  # back: forgotten (the blink is no loss)
        ({}, {"a", "b"}, 10.0, {}),  # the master never judges itself
        ({"gone": 1.0}, {"m", "a", "b"}, 10.0, {}),  # no longer a member: forgotten
    ],
)
def test_observe_tracks_absent_members(
    absent_since: dict[str, float], alive: set[str], now: float, expected: dict[str, float]
) -> None:
    ledger = observe(PresenceLedger(absent_since=absent_since), MEMBERS, frozenset(alive), ME, now)
    assert dict(ledger.absent_since) == expected


@pytest.mark.parametrize(
    ("absent_for", "prunes", "expected"),
    [
        (0.0, (), False),
        (PRESENCE_LOSS_CONFIRM_S - 0.01, (), False),  # inside the hysteresis
        (PRESENCE_LOSS_CONFIRM_S, (), True),
        (5.0, (1.0,) * (MAX_PRESENCE_PRUNES - 1), True),  # within budget
        (5.0, (1.0,) * MAX_PRESENCE_PRUNES, False),  # a flapping node: left to the silence timeout
    ],
)
def test_lost_nodes_applies_hysteresis_and_the_prune_budget(
    absent_for: float, prunes: tuple[float, ...], expected: bool
) -> None:
    now = 50.0
    ledger = PresenceLedger(absent_since={"a": now - absent_for}, pruned_at={"a": prunes} if prunes else {})
    assert ("a" in lost_nodes(ledger, now)) is expected


def test_prune_budget_recovers_after_the_window() -> None:
    ledger = record_prunes(record_prunes(PresenceLedger(), ["a"], 0.0), ["a"], 1.0)
    ledger = observe(ledger, MEMBERS, frozenset({"m", "b"}), ME, 10.0)
    assert lost_nodes(ledger, 10.0 + PRESENCE_LOSS_CONFIRM_S) == {}
    later = 1.0 + PRUNE_WINDOW_S
    ledger = observe(ledger, MEMBERS, frozenset({"m", "b"}), ME, later)
    assert "a" in lost_nodes(ledger, later)


def test_a_flapping_node_costs_at_most_the_budget_of_fast_prunes() -> None:
    """Simulate a node that vanishes and returns every 3 s for a minute: count fast prunes."""
    ledger, prunes, now = PresenceLedger(), 0, 0.0
    while now < 60.0:
        present = int(now) % 3 == 0
        ledger = observe(ledger, MEMBERS, frozenset({"m", "b"} | ({"a"} if present else set())), ME, now)
        lost = lost_nodes(ledger, now)
        if lost:
            prunes += 1
            ledger = record_prunes(ledger, lost, now)
            ledger = observe(ledger, ("m", "b"), frozenset({"m", "b"}), ME, now)  # pruned: no longer a member
        now += 0.25
    assert prunes == MAX_PRESENCE_PRUNES
