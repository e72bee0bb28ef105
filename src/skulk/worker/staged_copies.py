"""The worker's side of the staged-copy lifecycle: applying StagedModelEvicted, and the
recency pass at startup and instance deactivation.

A store-host delete (`DELETE /store/models/{id}`) becomes the master's StagedModelEvicted
event; every node named by it (all nodes when it names none) drops its local staged copy,
because a staged copy is an independent cache the store-host delete would otherwise leave
behind. A copy a live runner still uses (as its model or a companion) is kept: deleting
weights under a running engine helps nobody, and the recency pass collects the copy once
the runner is gone.

Decisions are pure (`eviction_applies`); the disk work runs in a thread, off the event loop,
through `StagedCopyKeeper`, which the node wires to `StateReplica.on_applied`. This module
never deletes the store's canonical copy (`staging.remove_staged_dir` refuses it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from skulk.model_store.eviction import EvictionPolicy
from skulk.model_store.staging import RemovalResult, apply_recency, remove_staged
from skulk.shared.types.events import IndexedEvent, StagedModelEvicted
from skulk.shared.types.ids import ModelId

logger = logging.getLogger(__name__)

MAX_PENDING_EVICTIONS = 64
"""Bound on queued disk jobs: evictions are rare (an operator's delete); past this many
pending, further events are logged and counted instead of queued without limit, and the
next recency pass reconciles what they would have removed."""


def eviction_applies(event: object, node_id: str) -> ModelId | None:
    """The model id whose staged copy this node must drop for `event`, or None."""
    if not isinstance(event, StagedModelEvicted):
        return None
    if event.node_ids is not None and node_id not in event.node_ids:
        return None
    return event.model_id


def evict_staged_model(
    staging_root: Path, model_id: str, in_use_model_ids: frozenset[str], canonical_root: Path | None
) -> RemovalResult:
    """Drop this node's staged copies of `model_id` (every revision) unless in use."""
    result = remove_staged(staging_root, in_use_model_ids, canonical_root, model_id=model_id)
    if result.removed:
        logger.info("dropped staged copy of %s (%s), freed %d bytes", model_id, ", ".join(result.removed),
                    result.freed_bytes)
    if result.kept_in_use:
        logger.info("kept staged copy of %s: a live runner uses it; the recency pass removes it later", model_id)
    return result


@dataclass
class StagedCopyKeeper:
    """Owns this node's staged copies' lifecycle. `on_event` is an `on_applied` listener."""

    node_id: str
    staging_root: Path
    canonical_root: Path | None
    policy: EvictionPolicy
    in_use: Callable[[], frozenset[str]]
    """Models (and companions) of live runners on this node, read on the event loop when a
    job is queued (State is only safe to read there)."""

    def __post_init__(self) -> None:
        self._pending: set[asyncio.Task] = set()
        self.dropped_events = 0

    def on_event(self, indexed: IndexedEvent) -> None:
        model_id = eviction_applies(indexed.event, self.node_id)
        if model_id is None:
            return
        if len(self._pending) >= MAX_PENDING_EVICTIONS:
            self.dropped_events += 1
            logger.warning("staged-copy eviction of %s not queued: %d jobs pending (dropped %d so far)", model_id,
                           len(self._pending), self.dropped_events)
            return
        self._spawn(asyncio.to_thread(
            evict_staged_model, self.staging_root, model_id, self.in_use(), self.canonical_root))

    async def reconcile(self) -> RemovalResult:
        """The recency pass: call at node startup (reconciles copies orphaned by a crashed
        session) and after an instance deactivates."""
        return await asyncio.to_thread(apply_recency, self.staging_root, self.policy, self.in_use(),
                                       self.canonical_root)

    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) for queued disk jobs, e.g. at shutdown or in tests."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._pending.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("staged-copy eviction failed: %r", task.exception())


__all__ = ["MAX_PENDING_EVICTIONS", "StagedCopyKeeper", "evict_staged_model", "eviction_applies"]
