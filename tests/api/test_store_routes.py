"""The model store's HTTP routes, and staging from a remote store over a real local socket."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from skulk.api.app import ApiContext, create_app
from skulk.api.routes.store import StoreContext
from skulk.master.placement import PlacementRequest, place
from skulk.model_store.eviction import EvictionPolicy
from skulk.model_store.staging import (
    RetryPolicy,
    StagingFailed,
    StagingOptions,
    StoreClient,
    scan_staged,
    stage_from_local,
    stage_from_remote,
)
from skulk.models.cards import builtin_cards_dir, resolve_cards
from skulk.models.downloads import read_marker
from skulk.shared.types.commands import EvictStagedModel
from skulk.shared.types.state import NodeInfo, State
from skulk.shared.types.telemetry import DiskReading, MemoryReading, NodeResources
from tests.api.live_server import live_server
from tests.model_store.test_staging import MODEL, REV_A, REV_B, make_canonical

GB = 10**9
FREE = 500 * GB
POLICY = EvictionPolicy(cleanup_on_deactivate=True, keep_recent_bytes=40 * 2**30, reserve_bytes=10 * 2**30)
OTHER = NodeResources(
    node_id="b", node_name="bee", version="0", memory=MemoryReading(ram_total_bytes=8 * GB, ram_available_bytes=4 * GB),
    disk=DiskReading(models_dir="/m", total_bytes=2000 * GB, free_bytes=123 * GB),
)
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.01, deadline_s=30)


class Harness:
    def __init__(self, tmp_path: Path, *, store_host: bool = True, api_key: str | None = None,
                 state: State | None = None, submit_fails: bool = False) -> None:
        self.models = tmp_path / "models"
        self.staging = tmp_path / "staging"
        self.models.mkdir(parents=True, exist_ok=True)
        self.submitted: list[object] = []
        self.state = state or State(nodes={"a": NodeInfo(node_id="a", node_name="a", version="0")})

        async def submit(command: object) -> None:
            if submit_fails:
                raise RuntimeError("no master")
            self.submitted.append(command)

        self.context = ApiContext(
            node_id="a", node_name="a", get_state=lambda: self.state, submit_command=submit,
            get_resources=lambda: {"b": OTHER}, api_key=api_key,
            store=StoreContext(staging_root=self.staging, canonical_root=self.models if store_host else None,
                               policy=POLICY, free_bytes=lambda _p: FREE),
        )
        self.app = create_app(self.context)
        self.client = TestClient(self.app)


def stage_here(h: Harness, model_id: str = MODEL, revision: str = REV_A, **kw) -> None:
    manifest = make_canonical(h.models, model_id, revision, **kw)
    stage_from_local(h.models / manifest.dir_name, manifest, h.staging, StagingOptions(free_bytes=lambda _p: FREE))


def assert_openai_error(response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and "type" in error


# -- storage ----------------------------------------------------------------------------------


def test_storage_breakdown(tmp_path):
    h = Harness(tmp_path)
    stage_here(h)
    body = h.client.get("/store/storage").json()
    me, other = body["nodes"]
    total = sum(f.stat().st_size for f in (h.models / "acme--tiny").iterdir() if f.name != "skulk-download.json")
    assert me["nodeId"] == "a" and me["isStoreHost"] is True
    assert me["canonicalBytes"] == total
    assert me["stagedBytes"] == total and me["stagedOwnBytes"] == 0  # hardlinks cost nothing
    assert me["freeBytes"] == FREE and me["reserveBytes"] == 10 * 2**30 and me["keepRecentBytes"] == 40 * 2**30
    assert me["staged"][0]["modelId"] == MODEL and me["staged"][0]["inUse"] is False
    assert other == {"nodeId": "b", "nodeName": "bee", "isStoreHost": None, "canonicalBytes": None,
                     "stagedBytes": None, "freeBytes": 123 * GB, "totalBytes": 2000 * GB, "reserveBytes": None}


def test_storage_on_a_staging_only_node(tmp_path):
    me = Harness(tmp_path, store_host=False).client.get("/store/storage").json()["nodes"][0]
    assert me["isStoreHost"] is False and me["canonicalBytes"] is None and me["stagedBytes"] == 0


def test_unconfigured_store_is_a_typed_503(tmp_path):
    context = ApiContext(node_id="a", node_name="a", get_state=State)
    assert_openai_error(TestClient(create_app(context)).get("/store/storage"), 503, "store_not_configured")


# -- manifests and files ----------------------------------------------------------------------


def test_manifests(tmp_path):
    h = Harness(tmp_path)
    make_canonical(h.models)
    make_canonical(h.models, revision=REV_B, pinned=True)
    listed = h.client.get("/store/models").json()["models"]
    assert sorted((m["dirName"], m["pinned"]) for m in listed) == [("acme--tiny", False), (f"acme--tiny@{REV_B}", True)]
    main = h.client.get(f"/store/models/{MODEL}").json()
    assert main["revision"] == REV_A and {f["path"] for f in main["files"]} == {
        "config.json", "model.safetensors", "tokenizer.json"}
    assert h.client.get(f"/store/models/{MODEL}", params={"revision": REV_B}).json()["dirName"] == f"acme--tiny@{REV_B}"
    assert h.client.get(f"/store/models/{MODEL}", params={"revision": REV_A}).json()["dirName"] == "acme--tiny"
    assert_openai_error(h.client.get("/store/models/acme/nope"), 404, "store_model_not_found")
    assert_openai_error(h.client.get(f"/store/models/{MODEL}", params={"revision": "c" * 40}), 404,
                        "store_model_not_found")


def test_a_staging_only_node_serves_no_store(tmp_path):
    h = Harness(tmp_path, store_host=False)
    assert_openai_error(h.client.get("/store/models"), 404, "no_store_here")
    assert_openai_error(h.client.delete(f"/store/models/{MODEL}"), 404, "no_store_here")


def test_file_serving_with_ranges(tmp_path):
    h = Harness(tmp_path)
    make_canonical(h.models)
    data = (h.models / "acme--tiny" / "model.safetensors").read_bytes()
    whole = h.client.get("/store/artifacts/acme--tiny/model.safetensors")
    assert whole.status_code == 200 and whole.content == data
    part = h.client.get("/store/artifacts/acme--tiny/model.safetensors", headers={"Range": "bytes=1000-"})
    assert part.status_code == 206 and part.content == data[1000:]
    assert part.headers["content-range"] == f"bytes 1000-{len(data) - 1}/{len(data)}"


@pytest.mark.parametrize(
    "path",
    [
        "/store/artifacts/acme--tiny/skulk-download.json",  # our marker is not a registered file
        "/store/artifacts/acme--tiny/unregistered.bin",
        "/store/artifacts/acme--tiny/..%2F..%2Fsecret.txt",
        "/store/artifacts/acme--tiny/sub/..%2F..%2F..%2Fsecret.txt",
        "/store/artifacts/..%2Facme--tiny/config.json",
        "/store/artifacts/.hidden/config.json",
        "/store/artifacts/acme--tiny/escape.json",
    ],
)
def test_file_serving_refuses_anything_unregistered(tmp_path, path):
    h = Harness(tmp_path)
    make_canonical(h.models)
    (tmp_path / "secret.txt").write_text("TOPSECRET")
    (h.models / "acme--tiny" / "unregistered.bin").write_bytes(b"x")
    # A registered name that is a symlink out of the model directory is refused too.
    marker_path = h.models / "acme--tiny" / "skulk-download.json"
    import json

    raw = json.loads(marker_path.read_text())
    raw["files"]["escape.json"] = 9
    marker_path.write_text(json.dumps(raw))
    os.symlink(tmp_path / "secret.txt", h.models / "acme--tiny" / "escape.json")
    response = h.client.get(path)
    assert response.status_code == 404 and b"TOPSECRET" not in response.content


# -- delete and purge -------------------------------------------------------------------------


def test_delete_broadcasts_eviction_and_removes_the_canonical_copy(tmp_path):
    h = Harness(tmp_path)
    make_canonical(h.models)
    make_canonical(h.models, revision=REV_B, pinned=True)
    make_canonical(h.models, "acme/other")
    response = h.client.delete(f"/store/models/{MODEL}")
    assert response.status_code == 200, response.text
    body = response.json()
    (command,) = h.submitted
    assert isinstance(command, EvictStagedModel) and command.model_id == MODEL
    assert body["commandId"] == command.command_id and body["evicting"] is True
    assert sorted(body["removedCanonical"]) == ["acme--tiny", f"acme--tiny@{REV_B}"]
    assert not (h.models / "acme--tiny").exists() and read_marker(h.models / "acme--other") is not None
    assert_openai_error(h.client.delete(f"/store/models/{MODEL}"), 404, "store_model_not_found")


def test_delete_with_no_master_changes_nothing(tmp_path):
    h = Harness(tmp_path, submit_fails=True)
    make_canonical(h.models)
    assert_openai_error(h.client.delete(f"/store/models/{MODEL}"), 503, "cluster_not_ready")
    assert read_marker(h.models / "acme--tiny") is not None


def test_delete_of_a_model_only_staged_still_broadcasts(tmp_path):
    h = Harness(tmp_path)
    stage_here(h)
    import shutil

    shutil.rmtree(h.models / "acme--tiny")
    assert h.client.delete(f"/store/models/{MODEL}").json()["removedCanonical"] == []
    assert len(h.submitted) == 1


def placed_state(model_id: str) -> State:
    cards = resolve_cards(builtin_cards_dir(), None).cards
    members = State(nodes={"a": NodeInfo(node_id="a", node_name="a", version="0")})
    resources = {"a": NodeResources(
        node_id="a", node_name="a", version="0",
        memory=MemoryReading(ram_total_bytes=64 * GB, ram_available_bytes=60 * GB),
        disk=DiskReading(models_dir="/m", total_bytes=10**12, free_bytes=10**12), backends=["mlx", "mlx-cpu"],
    )}
    counter = itertools.count()
    instance = place(cards[model_id], members, resources, PlacementRequest(model_id=model_id),
                     new_id=lambda: f"id{next(counter)}")
    return members.model_copy(update={"instances": {instance.instance_id: instance}})


def test_purge_staging_keeps_live_copies_and_the_store(tmp_path):
    live = "mlx-community/Llama-3.2-1B-Instruct-4bit"
    h = Harness(tmp_path, state=placed_state(live))
    stage_here(h)
    stage_here(h, live)
    body = h.client.post("/store/purge-staging").json()
    assert body["removed"] == ["acme--tiny"]
    assert body["keptInUse"] == ["mlx-community--Llama-3.2-1B-Instruct-4bit"]
    assert [e.model_id for e in scan_staged(h.staging)] == [live]
    assert read_marker(h.models / "acme--tiny") is not None  # canonical copy untouched
    storage = h.client.get("/store/storage").json()["nodes"][0]
    assert storage["staged"][0]["inUse"] is True


def test_store_routes_require_the_api_key(tmp_path):
    h = Harness(tmp_path, api_key="sekrit")
    for method, path in (("GET", "/store/storage"), ("GET", "/store/models"), ("POST", "/store/purge-staging"),
                         ("DELETE", f"/store/models/{MODEL}"), ("GET", "/store/artifacts/acme--tiny/config.json")):
        assert h.client.request(method, path).status_code == 401, path
    assert h.client.get("/store/storage", headers={"Authorization": "Bearer sekrit"}).status_code == 200


# -- staging from a remote store over a real socket -------------------------------------------


def test_stage_from_a_remote_store_resumes_with_ranges(tmp_path):
    store = Harness(tmp_path / "store", api_key="sekrit")
    manifest = make_canonical(store.models, files={
        "config.json": b'{"a": 1}', "model.safetensors": os.urandom(3 * 1024 * 1024 + 17), "sub/extra.json": b"{}",
    })
    staging = tmp_path / "node-b" / "staging"
    # An interrupted earlier attempt left half of the weights: marked with 'Z's, so the
    # result proves the transfer resumed from them rather than starting over.
    half = 1024 * 1024
    partial = staging / ".acme--tiny.partial"
    partial.mkdir(parents=True)
    (partial / ".skulk-staging-revision").write_text(REV_A)
    (partial / "model.safetensors.part").write_bytes(b"Z" * half)
    with live_server(store.app) as url, StoreClient(url, api_key="sekrit") as client:
        staged = stage_from_remote(client, MODEL, staging, StagingOptions(free_bytes=lambda _p: FREE), retry=FAST)
    source = store.models / manifest.dir_name
    assert (staged / "config.json").read_bytes() == (source / "config.json").read_bytes()
    assert (staged / "sub" / "extra.json").read_bytes() == b"{}"
    weights = (staged / "model.safetensors").read_bytes()
    assert weights == b"Z" * half + (source / "model.safetensors").read_bytes()[half:]
    assert (staged / "model.safetensors").stat().st_ino != (source / "model.safetensors").stat().st_ino
    assert read_marker(staged).revision == REV_A
    assert not partial.exists() and not list(staged.rglob("*.part"))


def test_remote_staging_refuses_a_short_file_and_keeps_nothing_half_made(tmp_path):
    store = Harness(tmp_path / "store")
    make_canonical(store.models, files={"config.json": b"{}", "model.safetensors": b"w" * 1000})
    marker = store.models / "acme--tiny" / "skulk-download.json"
    marker.write_text(marker.read_text().replace('"model.safetensors": 1000', '"model.safetensors": 2000'))
    staging = tmp_path / "staging"
    with live_server(store.app) as url, StoreClient(url) as client:
        with pytest.raises(StagingFailed) as failure:
            stage_from_remote(client, MODEL, staging, StagingOptions(free_bytes=lambda _p: FREE), retry=FAST)
    assert failure.value.kind in ("transfer", "size_mismatch")
    assert scan_staged(staging) == []


def test_remote_staging_of_an_unknown_model_is_not_found(tmp_path):
    store = Harness(tmp_path / "store")
    with live_server(store.app) as url, StoreClient(url) as client:
        with pytest.raises(StagingFailed) as failure:
            stage_from_remote(client, "acme/nope", tmp_path / "staging", retry=FAST)
    assert failure.value.kind == "not_found"


def test_remote_staging_with_the_wrong_key_fails_typed(tmp_path):
    store = Harness(tmp_path / "store", api_key="sekrit")
    make_canonical(store.models)
    with live_server(store.app) as url, StoreClient(url, api_key="wrong") as client:
        with pytest.raises(StagingFailed) as failure:
            stage_from_remote(client, MODEL, tmp_path / "staging", retry=FAST)
    assert "401" in failure.value.reason


def test_an_unreachable_store_is_typed_for_the_direct_download_fallback(tmp_path):
    from tests.api.live_server import free_port

    with StoreClient(f"http://127.0.0.1:{free_port()}", timeout_s=2) as client:
        with pytest.raises(StagingFailed) as failure:
            stage_from_remote(client, MODEL, tmp_path / "staging", retry=FAST)
    assert failure.value.kind == "unreachable"
