"""Staging from a remote store reports progress like a download: (staged, total) from the
transfer, resumed bytes credited, and in the worker DownloadProgress telemetry under the
attempt's id, gated like every download."""

from __future__ import annotations

import itertools
import os

from skulk.model_store.host import StoreAddress, StoreChoice
from skulk.model_store.node_store import NodeStore, StoreBinding
from skulk.model_store.staging import StagingOptions, StoreClient, stage_from_remote
from skulk.shared.types.events import DownloadCompleted, DownloadPending
from skulk.shared.types.telemetry import DownloadProgress
from tests.api.live_server import live_server
from tests.api.test_store_routes import FAST, FREE, Harness
from tests.mockhub import hub_card
from tests.model_store.test_staging import MODEL, REV_A, make_canonical
from tests.worker.test_worker_downloads import _store_worker


def test_remote_staging_reports_progress_with_resumed_bytes_credited(tmp_path):
    store = Harness(tmp_path / "store")
    manifest = make_canonical(store.models, files={
        "config.json": b'{"a": 1}', "model.safetensors": os.urandom(2 * 1024 * 1024 + 5),
    })
    staging = tmp_path / "node-b" / "staging"
    half = 1024 * 1024
    partial = staging / ".acme--tiny.partial"
    partial.mkdir(parents=True)
    (partial / ".skulk-staging-revision").write_text(REV_A)
    (partial / "model.safetensors.part").write_bytes(b"Z" * half)
    samples: list[tuple[int, int]] = []
    with live_server(store.app) as url, StoreClient(url) as client:
        stage_from_remote(client, MODEL, staging, StagingOptions(free_bytes=lambda _p: FREE), retry=FAST,
                          on_progress=lambda done, total: samples.append((done, total)))
    total = manifest.total_bytes
    assert samples[0] == (half, total)  # what the interrupted attempt left counts from the start
    assert samples[-1] == (total, total)
    assert all(b[0] >= a[0] for a, b in itertools.pairwise(samples)), "progress went backwards"
    assert {t for _d, t in samples} == {total} and len(samples) > 3


async def test_the_worker_publishes_staging_progress_as_download_telemetry(tmp_path):
    store = Harness(tmp_path / "store")
    manifest = make_canonical(store.models, files={
        "config.json": b'{"model_type": "llama"}', "model.safetensors": os.urandom(1024 * 1024),
    })
    card = hub_card(MODEL)
    telemetry: list = []
    with live_server(store.app) as url:
        host, port = url.removeprefix("http://").split(":")
        node_store = NodeStore(staging_root=tmp_path / "b" / "staging", canonical_root=None,
                               free_bytes=lambda _p: FREE)
        binding = StoreBinding(node_store, StoreChoice(StoreAddress(host, int(port)), "master", False))
        worker, producer = _store_worker(tmp_path / "b", {card.model_id: card}, binding, telemetry)
        await worker.downloads.resolve(card.model_id)

    pending, completed = producer.events
    assert isinstance(pending, DownloadPending) and isinstance(completed, DownloadCompleted)
    readings = [r for _key, r in telemetry]
    assert readings and all(isinstance(r, DownloadProgress) for r in readings)
    assert {r.attempt_id for r in readings} == {pending.attempt_id}
    assert readings[-1].downloaded_bytes == readings[-1].total_bytes == manifest.total_bytes
    assert {key for key, _r in telemetry} == {("download", card.model_id)}  # one latest-value slot
