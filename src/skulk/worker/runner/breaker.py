"""The crash circuit breaker: when to stop relaunching a runner that keeps dying.

Pure data in, data out: the worker records each runner crash with the time it saw it and
asks `should_give_up` before relaunching. Relaunching a runner that dies on load (a bad
file, a GPU-memory leak, an OOM kill) only repeats the damage; after `max_crashes` within
`window_s` the worker gives the instance up instead. This module never reads the clock and
never touches processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from skulk.shared.types.ids import InstanceId

CRASH_BREAKER_MAX_CRASHES = 3
"""Crashes of one instance's runners, within the window, after which the worker gives up.
Two are forgiven: one stray OOM kill plus one retry that races the memory being freed."""

CRASH_BREAKER_WINDOW_S = 600.0
"""Crashes older than this are forgotten: a runner that served for ten minutes between
crashes is flaky, not broken, and deserves another launch."""


@dataclass(frozen=True)
class CrashBreaker:
    max_crashes: int = CRASH_BREAKER_MAX_CRASHES
    window_s: float = CRASH_BREAKER_WINDOW_S
    crashes: Mapping[InstanceId, tuple[float, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """Per instance, the monotonic times of crashes still inside the window, oldest first."""

    def __post_init__(self) -> None:
        if self.max_crashes < 1:
            raise ValueError(f"max_crashes must be >= 1, got {self.max_crashes}")
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")

    def _recent(self, instance_id: InstanceId, now: float) -> tuple[float, ...]:
        return tuple(t for t in self.crashes.get(instance_id, ()) if now - t < self.window_s)

    def record(self, instance_id: InstanceId, now: float) -> CrashBreaker:
        """A new breaker with one more crash of `instance_id` at `now` (old ones pruned)."""
        updated = dict(self.crashes)
        updated[instance_id] = (*self._recent(instance_id, now), now)
        return replace(self, crashes=MappingProxyType(updated))

    def crash_count(self, instance_id: InstanceId, now: float) -> int:
        return len(self._recent(instance_id, now))

    def should_give_up(self, instance_id: InstanceId, now: float) -> bool:
        return self.crash_count(instance_id, now) >= self.max_crashes

    def forget(self, instance_id: InstanceId) -> CrashBreaker:
        """Drop an instance's history (it was deleted, or re-placed as a new instance)."""
        if instance_id not in self.crashes:
            return self
        updated = {k: v for k, v in self.crashes.items() if k != instance_id}
        return replace(self, crashes=MappingProxyType(updated))


__all__ = ["CRASH_BREAKER_MAX_CRASHES", "CRASH_BREAKER_WINDOW_S", "CrashBreaker"]
