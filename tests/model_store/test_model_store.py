"""The node's store view: config -> roots and policy, and `stage_model` on the store host
(hardlinks) and on another node (HTTP from a real local store, surviving a cut transfer)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skulk.api.app import ApiContext, create_app
from skulk.datadir.config import ModelStoreSection
from skulk.datadir.paths import SkulkPaths
from skulk.model_store.eviction import GIB, EvictionPolicy
from skulk.model_store.host import StoreAddress, StoreChoice
from skulk.model_store.node_store import NodeStore, find_registered, node_store, stage_model
from skulk.model_store.staging import RetryPolicy, StagingFailed
from skulk.models.downloads import read_marker
from skulk.shared.types.state import State
from tests.api.live_server import live_server
from tests.model_store.test_staging import MODEL, REV_A, REV_B, make_canonical

FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.01, deadline_s=60)
SELF = StoreChoice(StoreAddress("127.0.0.1", 1), "bootstrap", True)


def paths(tmp_path: Path) -> SkulkPaths:
    return SkulkPaths(data_home=tmp_path / "data", models_dir=tmp_path / "data" / "models",
                      cache_home=tmp_path / "cache", custom_cards_dir=tmp_path / "cards")


def test_node_store_from_config(tmp_path):
    section = ModelStoreSection(cleanup_on_deactivate=False, staging_keep_recent_gb=2.5, disk_reserve_gb=1)
    host = node_store(paths(tmp_path), section, hosts_store=True)
    assert host.staging_root == tmp_path / "data" / "staging"
    assert host.canonical_root == tmp_path / "data" / "models"
    assert host.policy == EvictionPolicy(False, int(2.5 * GIB), GIB)
    assert node_store(paths(tmp_path), ModelStoreSection(), hosts_store=False).canonical_root is None
    assert node_store(paths(tmp_path), ModelStoreSection(), hosts_store=False).policy == EvictionPolicy()


def test_find_registered_picks_the_exact_revision(tmp_path):
    make_canonical(tmp_path, revision=REV_A)
    make_canonical(tmp_path, revision=REV_B, pinned=True)
    assert find_registered(tmp_path, MODEL, None).revision == REV_A
    assert find_registered(tmp_path, MODEL, REV_B).pinned is True
    assert find_registered(tmp_path, MODEL, REV_A).pinned is False  # main happens to be that commit
    assert find_registered(tmp_path, MODEL, "c" * 40) is None
    assert find_registered(tmp_path, "acme/none", None) is None


def test_stage_model_on_the_store_host_links(tmp_path):
    store = NodeStore(staging_root=tmp_path / "staging", canonical_root=tmp_path / "models",
                      free_bytes=lambda _p: 10**15)
    make_canonical(store.canonical_root)
    staged = stage_model(store, SELF, MODEL)
    assert (staged / "model.safetensors").stat().st_nlink == 2
    with pytest.raises(StagingFailed) as failure:
        stage_model(store, SELF, "acme/none")
    assert failure.value.kind == "not_found"


class CutOnce:
    """ASGI wrapper: the first transfer of the weights stops after `cut_bytes` and the
    connection drops, as a flaky link would; every request's Range header is recorded."""

    def __init__(self, app, cut_bytes: int) -> None:
        self.app, self.cut_bytes, self.cut_done = app, cut_bytes, False
        self.ranges: list[str | None] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].endswith("/model.safetensors"):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        self.ranges.append(headers.get(b"range", b"").decode() or None)
        if self.cut_done:
            return await self.app(scope, receive, send)
        self.cut_done = True
        sent = 0

        async def cutting_send(message):
            nonlocal sent
            if message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
                if sent > self.cut_bytes:
                    raise ConnectionResetError("cut by the test")
            await send(message)

        return await self.app(scope, receive, cutting_send)


def test_stage_model_from_a_remote_store_survives_a_cut_transfer(tmp_path):
    canonical = tmp_path / "store" / "models"
    canonical.mkdir(parents=True)
    weights = os.urandom(2 * 1024 * 1024 + 5)
    make_canonical(canonical, files={"config.json": b"{}", "model.safetensors": weights})
    context = ApiContext(node_id="s", node_name="s", get_state=State,
                         store=NodeStore(staging_root=tmp_path / "store" / "staging", canonical_root=canonical))
    app = CutOnce(create_app(context), cut_bytes=512 * 1024)
    node = NodeStore(staging_root=tmp_path / "b" / "staging", canonical_root=None, free_bytes=lambda _p: 10**15)
    with live_server(app) as url:
        host, port = url.removeprefix("http://").split(":")
        choice = StoreChoice(StoreAddress(host, int(port)), "master", False)
        staged = stage_model(node, choice, MODEL, retry=FAST)
    assert (staged / "model.safetensors").read_bytes() == weights
    assert read_marker(staged).revision == REV_A
    first, *rest = app.ranges
    assert first is None and rest and rest[0].startswith("bytes=") and rest[0] != "bytes=0-"
    resumed_from = int(rest[0].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_from <= 512 * 1024 + 64 * 1024
