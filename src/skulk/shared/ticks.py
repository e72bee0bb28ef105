"""One tick grid per process, so that periodic loops wake the event loop together.

Every wake-up of an idle node's event loop costs CPU whatever it then does (about 0.1 ms on a
loaded 2-core VM, most of it the wake itself: bench/idle.py). A dozen periodic loops, each
sleeping its own period from its own start, woke the loop at a dozen phases a second. A loop
that sleeps `until_tick_s(now, period_s)` instead wakes on this process's grid: instants
`TICK_PHASE_S + k * period_s`. Periods that are multiples of GRID_S share their instants, so
all the loops due at an instant cost one wake-up between them.

A loop keeps its period exactly (it even stops drifting by the time its own work takes);
only its phase within the period moves. The grid's phase is drawn once per process, so
nodes sharing a host do not all wake at the same instants.

Pure: the caller reads the clock (the event loop's `loop.time()`, the clock asyncio's timers
run on) and sleeps.
"""

from __future__ import annotations

import math
import random
from typing import Final

GRID_S: Final = 0.25
"""The finest period the grid is meant for (the election and replica ticks); every periodic
loop that should share wake-ups has a period that is a multiple of it."""

TICK_PHASE_S: Final = random.random() * GRID_S
"""This process's grid offset, drawn at import."""

_SAME_INSTANT: Final = 1e-6
"""A clock reading this close below a grid instant (in periods) counts as that instant: a
timer may fire a hair early, and must not then tick again at once."""


def next_tick_at(now: float, period_s: float, phase_s: float = TICK_PHASE_S) -> float:
    """The first instant `phase_s + k * period_s` (k an integer) after `now`."""
    if period_s <= 0:
        raise ValueError(f"period_s must be positive, got {period_s}")
    k = math.floor((now - phase_s) / period_s + _SAME_INSTANT) + 1
    return phase_s + k * period_s


def until_tick_s(now: float, period_s: float, phase_s: float = TICK_PHASE_S) -> float:
    """Seconds from `now` to the next grid instant of `period_s`: more than 0, at most
    `period_s` (give or take `_SAME_INSTANT`)."""
    return max(next_tick_at(now, period_s, phase_s) - now, 0.0)


__all__ = ["GRID_S", "TICK_PHASE_S", "next_tick_at", "until_tick_s"]
