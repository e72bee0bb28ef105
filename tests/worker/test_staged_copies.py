"""Applying StagedModelEvicted on a node: drop the staged copy unless a live runner uses it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from skulk.model_store.eviction import EvictionPolicy
from skulk.model_store.staging import StagingOptions, scan_staged, stage_from_local
from skulk.models.downloads import read_marker
from skulk.shared.types.events import IndexedEvent, StagedModelEvicted, TracingStateChanged
from skulk.worker.staged_copies import StagedCopyKeeper, eviction_applies
from tests.model_store.test_staging import make_canonical

EVICT_ALL = StagedModelEvicted(event_id="e1", model_id="acme/a")


@pytest.mark.parametrize(
    ("event", "node", "expected"),
    [
        (EVICT_ALL, "n1", "acme/a"),
        (StagedModelEvicted(event_id="e2", model_id="acme/a", node_ids=["n1"]), "n1", "acme/a"),
        (StagedModelEvicted(event_id="e3", model_id="acme/a", node_ids=["n2"]), "n1", None),
        (StagedModelEvicted(event_id="e4", model_id="acme/a", node_ids=[]), "n1", None),
        (TracingStateChanged(event_id="e5", enabled=True), "n1", None),
    ],
)
def test_eviction_applies(event, node, expected):
    assert eviction_applies(event, node) == expected


def indexed(event, idx: int = 0) -> IndexedEvent:
    return IndexedEvent(idx=idx, origin="master", indexed_at=datetime.now(UTC), event=event)


async def test_keeper_drops_idle_copies_and_keeps_live_ones(tmp_path):
    models, staging = tmp_path / "models", tmp_path / "staging"
    for model in ("acme/a", "acme/b"):
        m = make_canonical(models, model)
        stage_from_local(models / m.dir_name, m, staging, StagingOptions(free_bytes=lambda _p: 10**15))
    live: set[str] = {"acme/b"}
    keeper = StagedCopyKeeper("n1", staging, models, EvictionPolicy(), lambda: frozenset(live))
    keeper.on_event(indexed(StagedModelEvicted(event_id="x", model_id="acme/a")))
    keeper.on_event(indexed(StagedModelEvicted(event_id="y", model_id="acme/b"), 1))
    keeper.on_event(indexed(StagedModelEvicted(event_id="z", model_id="acme/a", node_ids=["other"]), 2))
    await keeper.drain(timeout_s=10)
    assert [e.model_id for e in scan_staged(staging)] == ["acme/b"]
    # The store's canonical copies are untouched.
    assert read_marker(models / "acme--a") is not None and read_marker(models / "acme--b") is not None
    # Once the runner is gone, the recency pass collects nothing within budget, and an
    # explicit eviction now applies.
    live.clear()
    keeper.on_event(indexed(StagedModelEvicted(event_id="w", model_id="acme/b"), 3))
    await keeper.drain(timeout_s=10)
    assert scan_staged(staging) == []


async def test_keeper_reconcile_runs_the_recency_pass(tmp_path):
    models, staging = tmp_path / "models", tmp_path / "staging"
    for i, model in enumerate(("acme/old", "acme/new")):
        m = make_canonical(models, model, files={"w.safetensors": b"x" * 100})
        stage_from_local(models / m.dir_name, m, staging, StagingOptions(free_bytes=lambda _p: 10**15, now_s=i + 1))
    # Hardlinked copies free nothing, so they cost nothing against the budget: all kept.
    policy = EvictionPolicy(cleanup_on_deactivate=True, keep_recent_bytes=0, reserve_bytes=0)
    keeper = StagedCopyKeeper("n1", staging, models, policy, frozenset)
    assert (await keeper.reconcile()).removed == ()
    # Real copies (the store is elsewhere) beyond a 150-byte budget: the oldest goes.
    for entry in scan_staged(staging):
        for f in entry.path.glob("w.safetensors"):
            data = f.read_bytes()
            f.unlink()
            f.write_bytes(data)
    keeper = StagedCopyKeeper("n1", staging, models,
                              EvictionPolicy(cleanup_on_deactivate=True, keep_recent_bytes=150, reserve_bytes=0),
                              frozenset)
    assert (await keeper.reconcile()).removed == ("acme--old",)
