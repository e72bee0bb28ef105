"""The process tick grid (skulk.shared.ticks): where a periodic loop's next wake-up falls."""

from __future__ import annotations

import pytest

from skulk.shared.ticks import GRID_S, TICK_PHASE_S, next_tick_at, until_tick_s


@pytest.mark.parametrize(("now", "period_s", "phase_s", "expected"), [
    (0.0, 0.25, 0.0, 0.25),        # on an instant: the next one, never the same
    (0.1, 0.25, 0.0, 0.25),
    (0.3, 0.25, 0.0, 0.5),
    (10.3, 1.0, 0.1, 11.1),
    (10.05, 1.0, 0.1, 10.1),
    (10.1 - 1e-9, 1.0, 0.1, 11.1),  # a timer that fired a hair early does not tick again at once
    (-3.2, 0.5, 0.0, -3.0),         # monotonic clocks may start anywhere
    (7.0, 5.0, 0.2, 10.2),
])
def test_next_tick_at(now, period_s, phase_s, expected) -> None:
    assert next_tick_at(now, period_s, phase_s) == pytest.approx(expected)


def test_loops_whose_periods_share_the_grid_wake_together() -> None:
    # From any start, a 0.25 s, a 0.5 s and a 1 s loop land on common instants of the grid.
    for now in (0.0, 0.37, 123.456):
        one_s = next_tick_at(now, 1.0)
        quarter = next_tick_at(now, GRID_S)
        while quarter < one_s - 1e-9:
            quarter = next_tick_at(quarter, GRID_S)
        half = next_tick_at(now, 0.5)
        while half < one_s - 1e-9:
            half = next_tick_at(half, 0.5)
        assert quarter == pytest.approx(one_s) and half == pytest.approx(one_s)


@pytest.mark.parametrize("period_s", [GRID_S, 0.5, 1.0, 2.0, 5.0])
def test_until_tick_s_never_waits_longer_than_a_period(period_s) -> None:
    for step in range(200):
        now = step * 0.0371
        wait_s = until_tick_s(now, period_s)
        assert 0.0 < wait_s <= period_s * (1 + 1e-5)
        assert (now + wait_s - TICK_PHASE_S) / period_s == pytest.approx(round((now + wait_s - TICK_PHASE_S) / period_s))


def test_a_period_must_be_positive() -> None:
    with pytest.raises(ValueError):
        next_tick_at(1.0, 0.0)
