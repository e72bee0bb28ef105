"""Which staged model copies a node deletes, and whether a pending allocation then fits.

Staged copies are a cache: a node keeps recently used models so a re-placement starts
without a transfer, but the cache must never be what fills a node's disk. Two passes, both
decided here as one pure function over plain data (`plan_eviction`), so every priority is a
table-driven test:

1. recency (only with `cleanup_on_deactivate`): idle copies are kept newest-first by last
   use up to the `staging_keep_recent_gb` grace budget; everything older goes.
2. disk safety (whenever an allocation is pending, whatever `cleanup_on_deactivate` says):
   least-recently-used idle copies go until the allocation fits with the operating-system
   reserve left free. Disk safety overrides the grace budget.

The in-use set (every model a live runner needs, companions included) is always kept and
never counts against the budget, and the store's canonical copy is never a candidate: the
store is the cluster's source of truth, not a cache. This module never touches the disk or
reads the clock; `staging.py` measures the copies and carries out the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from skulk.shared.health import DEFAULT_RESERVE_BYTES, GIB
from skulk.shared.types.state import State

DEFAULT_KEEP_RECENT_BYTES = 40 * GIB
"""Warm-cache grace budget (`staging_keep_recent_gb`): enough for a few mid-size models, so
swapping between them does not re-transfer, small next to a model host's disk."""
# DEFAULT_RESERVE_BYTES (from shared.health, one figure for the cluster): free space the
# safety pass always leaves (`disk_reserve_gb`): the OS, logs and swap need room, and a full
# disk fails in ways far worse than a refused staging.


@dataclass(frozen=True)
class StagedCopy:
    """One model copy on a node, as the planner sees it."""

    key: str
    """The copy's identity on the node: its staging directory name (one per model and
    pinned revision)."""
    size_bytes: int
    """Bytes deleting this copy frees: files hardlinked to the store's canonical copy count
    zero, because the store still holds their blocks."""
    last_used_s: float
    """When a runner last used it (any clock, as long as all copies use the same one)."""
    in_use: bool = False
    """A live runner or an active staging transaction needs it (as its model or as a
    companion: MTP sidecar, assistant, draft, split vision weights)."""
    canonical: bool = False
    """The store's canonical copy: never evicted, never counted."""


@dataclass(frozen=True)
class EvictionPolicy:
    cleanup_on_deactivate: bool = True
    keep_recent_bytes: int = DEFAULT_KEEP_RECENT_BYTES
    reserve_bytes: int = DEFAULT_RESERVE_BYTES

    @classmethod
    def from_gb(cls, cleanup_on_deactivate: bool, keep_recent_gb: float, reserve_gb: float) -> EvictionPolicy:
        """From `skulk.yaml`'s model_store section (GiB, as the config documents them)."""
        return cls(cleanup_on_deactivate, int(keep_recent_gb * GIB), int(reserve_gb * GIB))


@dataclass(frozen=True)
class EvictionPlan:
    evict: tuple[str, ...]
    """Keys of the copies to delete, in deletion order (oldest first)."""
    fits: bool
    """The pending allocation fits once `evict` is gone (True when nothing is pending)."""
    needed_bytes: int
    """Pending bytes plus the reserve (0 when nothing is pending)."""
    available_bytes: int
    """Free bytes once `evict` is gone."""

    @property
    def shortfall_bytes(self) -> int:
        return max(0, self.needed_bytes - self.available_bytes)


def candidates(copies: Iterable[StagedCopy]) -> list[StagedCopy]:
    """Idle, non-canonical copies, newest first (ties broken by key, so the plan is
    the same on every run)."""
    idle = [c for c in copies if not c.in_use and not c.canonical]
    return sorted(idle, key=lambda c: (-c.last_used_s, c.key))


def over_budget(newest_first: Sequence[StagedCopy], keep_recent_bytes: int) -> list[StagedCopy]:
    """The recency pass: keep the newest copies while their total stays within the budget;
    the first copy that would cross it and every older one go (a strict recency cut, so an
    old small model never outlives a newer large one)."""
    kept_bytes = 0
    for index, copy in enumerate(newest_first):
        if kept_bytes + copy.size_bytes > keep_recent_bytes:
            return list(newest_first[index:])
        kept_bytes += copy.size_bytes
    return []


def for_space(oldest_first: Sequence[StagedCopy], available_bytes: int, needed_bytes: int) -> list[StagedCopy] | None:
    """The safety pass: the least-recently-used copies whose deletion makes `needed_bytes`
    fit; None when even deleting all of them is not enough. Copies that free nothing (all
    hardlinks into the store) are skipped: deleting them only costs a future re-stage."""
    chosen: list[StagedCopy] = []
    for copy in oldest_first:
        if available_bytes >= needed_bytes:
            break
        if copy.size_bytes == 0:
            continue
        chosen.append(copy)
        available_bytes += copy.size_bytes
    return chosen if available_bytes >= needed_bytes else None


def plan_eviction(
    copies: Iterable[StagedCopy], policy: EvictionPolicy, free_bytes: int, pending_bytes: int | None = None
) -> EvictionPlan:
    """What to delete: the recency pass, then (with an allocation pending) the safety pass.

    When the allocation cannot fit even with every idle copy gone, the safety pass deletes
    nothing beyond the recency pass and reports `fits=False`: destroying the warm cache for
    a transfer that is refused anyway helps nobody."""
    newest_first = candidates(copies)
    evicted = over_budget(newest_first, policy.keep_recent_bytes) if policy.cleanup_on_deactivate else []
    available = free_bytes + sum(c.size_bytes for c in evicted)
    if pending_bytes is None:
        return EvictionPlan(_ids_oldest_first(evicted), True, 0, available)
    needed = pending_bytes + policy.reserve_bytes
    gone = {c.key for c in evicted}
    remaining_oldest_first = [c for c in reversed(newest_first) if c.key not in gone]
    extra = for_space(remaining_oldest_first, available, needed)
    if extra is None:
        return EvictionPlan(_ids_oldest_first(evicted), False, needed, available)
    evicted = evicted + extra
    return EvictionPlan(_ids_oldest_first(evicted), True, needed, available + sum(c.size_bytes for c in extra))


def in_use_model_ids(
    state: State, node_id: str, companions: Callable[[str], Iterable[str]] = lambda _model_id: ()
) -> frozenset[str]:
    """Models a live runner on `node_id` needs: every placed instance with a shard here,
    plus each one's companion repos (which no instance names, but its runner loads)."""
    models = {i.model_id for i in state.instances.values() if node_id in i.node_ids()}
    return frozenset(models | {c for m in models for c in companions(m)})


def _ids_oldest_first(copies: Iterable[StagedCopy]) -> tuple[str, ...]:
    ordered = sorted(copies, key=lambda c: (c.last_used_s, c.key))
    return tuple(c.key for c in ordered)


__all__ = [
    "DEFAULT_KEEP_RECENT_BYTES",
    "DEFAULT_RESERVE_BYTES",
    "GIB",
    "EvictionPlan",
    "EvictionPolicy",
    "StagedCopy",
    "candidates",
    "for_space",
    "in_use_model_ids",
    "over_budget",
    "plan_eviction",
]
