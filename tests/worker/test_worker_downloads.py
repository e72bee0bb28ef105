"""The worker resolving a Hugging Face card: the download events and telemetry it emits
(DownloadPending -> DownloadProgress readings -> DownloadCompleted / DownloadFailed), against
the mock hub over real HTTP. Router, replica and producer are small recording fakes."""

from __future__ import annotations

import asyncio

from skulk.artifacts.plan import FailureCooldown
from skulk.shared.types.events import DownloadCompleted, DownloadFailed, DownloadPending
from skulk.shared.types.state import DownloadStatusCompleted, State
from skulk.shared.types.telemetry import DownloadProgress
from skulk.worker.main import Worker
from tests.mockhub import (
    GGUF_FILE,
    TINY_GGUF_REPO,
    hub_card,
    mock_hub,  # noqa: F401 - fixture
    tiny_artifacts,  # noqa: F401 - fixture
)


class FakeRouter:
    node_id = "node-a"

    def __init__(self) -> None:
        self.published: list[object] = []

    async def publish(self, _topic, message, *, to_node=None) -> None:
        self.published.append(message)


class FakeReplica:
    def __init__(self) -> None:
        self.state = State()

    def on_applied(self, _callback) -> None:
        return None


class FakeProducer:
    def __init__(self) -> None:
        self.events: list[object] = []

    def submit(self, event) -> int:
        self.events.append(event)
        return len(self.events) - 1


def _worker(tmp_path, cards, telemetry: list | None = None) -> tuple[Worker, FakeProducer, FakeReplica, FakeRouter]:
    router, replica, producer = FakeRouter(), FakeReplica(), FakeProducer()
    publish = None if telemetry is None else (lambda key, reading: telemetry.append((key, reading)))
    worker = Worker(router, replica, producer, models_dir=tmp_path, cards=lambda: cards,  # type: ignore[arg-type]
                    deliver_local=lambda _frame: None, publish_telemetry=publish)
    return worker, producer, replica, router


async def test_download_emits_pending_progress_then_completed(mock_hub, tmp_path):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    telemetry: list = []
    worker, producer, _replica, _router = _worker(tmp_path, {card.model_id: card}, telemetry)

    await worker.downloads.resolve(card.model_id)

    size = len(mock_hub.repos[TINY_GGUF_REPO].commits[mock_hub.repos[TINY_GGUF_REPO].main][GGUF_FILE])
    assert worker.stats()["artifacts"][card.model_id] == str(tmp_path / "mock-org--tiny-llama-GGUF" / GGUF_FILE)
    pending, completed = producer.events
    assert isinstance(pending, DownloadPending) and isinstance(completed, DownloadCompleted)
    assert pending.attempt_id == completed.attempt_id and pending.node_id == "node-a"
    assert completed.total_bytes == size
    readings = [r for _key, r in telemetry]
    assert readings and all(isinstance(r, DownloadProgress) for r in readings)
    assert readings[-1].downloaded_bytes == size and readings[-1].attempt_id == pending.attempt_id
    assert {key for key, _r in telemetry} == {("download", card.model_id)}

    # Completed in State: a later resolve of the same copy emits nothing.
    again, again_producer, again_replica, _ = _worker(tmp_path, {card.model_id: card})
    again_replica.state = State(downloads={"node-a": {card.model_id: DownloadStatusCompleted(
        attempt_id=completed.attempt_id, total_bytes=completed.total_bytes)}})
    await again.downloads.resolve(card.model_id)
    assert again_producer.events == []
    assert again.stats()["artifacts"][card.model_id].endswith(GGUF_FILE)


async def test_a_copy_on_disk_is_reported_completed_once(mock_hub, tmp_path):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    first, _, _, router = _worker(tmp_path, {card.model_id: card})  # no telemetry sink: the router
    await first.downloads.resolve(card.model_id)
    for _ in range(100):  # the fallback publishes from background tasks
        if router.published:
            break
        await asyncio.sleep(0.01)
    assert router.published and isinstance(router.published[-1], DownloadProgress)
    seen = len(mock_hub.requests)
    worker, producer, _replica, _ = _worker(tmp_path, {card.model_id: card}, [])
    await worker.downloads.resolve(card.model_id)
    assert [type(e) for e in producer.events] == [DownloadCompleted]
    size = len(mock_hub.repos[TINY_GGUF_REPO].commits[mock_hub.repos[TINY_GGUF_REPO].main][GGUF_FILE])
    assert producer.events[0].total_bytes == size
    assert len(mock_hub.requests) == seen  # no network for a complete copy


async def test_failed_download_emits_failed_with_reason_and_fails_the_artifact(mock_hub, tmp_path):
    card = hub_card("mock-org/missing")
    worker, producer, _replica, _router = _worker(tmp_path, {card.model_id: card})  # no telemetry sink

    await worker.downloads.resolve(card.model_id)

    pending, failed = producer.events
    assert isinstance(pending, DownloadPending) and isinstance(failed, DownloadFailed)
    assert failed.attempt_id == pending.attempt_id
    assert "does not exist" in failed.error_message
    assert "does not exist" in worker.stats()["artifactFailures"][card.model_id]
    assert card.model_id not in worker.stats()["artifacts"]


async def test_a_passing_download_failure_is_forgotten_after_a_cool_down(mock_hub, tmp_path, monkeypatch):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    worker, producer, _replica, _ = _worker(tmp_path, {card.model_id: card}, [])
    worker.failure_cooldown = FailureCooldown(cooldown_s=0.05)
    worker.downloads.cancel()  # as at shutdown: a passing failure
    await worker.downloads.resolve(card.model_id)
    assert "cancelled" in worker.stats()["artifactFailures"][card.model_id]
    assert isinstance(producer.events[-1], DownloadFailed)

    for _ in range(200):
        if card.model_id not in worker.stats()["artifactFailures"]:
            break
        await asyncio.sleep(0.01)
    assert card.model_id not in worker.stats()["artifactFailures"]

    # A 404 needs an operator: it is kept.
    missing = hub_card("mock-org/missing")
    worker2, _, _, _ = _worker(tmp_path, {missing.model_id: missing}, [])
    await worker2.downloads.resolve(missing.model_id)
    await asyncio.sleep(0.2)
    assert missing.model_id in worker2.stats()["artifactFailures"]


# -- through the model store ------------------------------------------------------------------


def _store_worker(tmp_path, cards, binding, telemetry: list | None = None):
    router, replica, producer = FakeRouter(), FakeReplica(), FakeProducer()
    publish = None if telemetry is None else (lambda key, reading: telemetry.append((key, reading)))
    worker = Worker(router, replica, producer, models_dir=tmp_path / "models", cards=lambda: cards,  # type: ignore[arg-type]
                    deliver_local=lambda _frame: None, publish_telemetry=publish, store=lambda: binding)
    return worker, producer


def _self_binding(tmp_path):
    from skulk.model_store.host import StoreAddress, StoreChoice
    from skulk.model_store.node_store import NodeStore, StoreBinding

    store = NodeStore(staging_root=tmp_path / "staging", canonical_root=tmp_path / "models",
                      free_bytes=lambda _p: 10**15)
    return StoreBinding(store, StoreChoice(StoreAddress("127.0.0.1", 1), "bootstrap", True))


async def test_the_store_host_downloads_into_its_store_and_stages_by_hardlink(mock_hub, tmp_path):
    import os

    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    telemetry: list = []
    worker, producer = _store_worker(tmp_path, {card.model_id: card}, _self_binding(tmp_path), telemetry)

    await worker.downloads.resolve(card.model_id)

    staged = tmp_path / "staging" / "mock-org--tiny-llama-GGUF" / GGUF_FILE
    canonical = tmp_path / "models" / "mock-org--tiny-llama-GGUF" / GGUF_FILE
    assert worker.stats()["artifacts"][card.model_id] == str(staged)
    assert os.stat(staged).st_ino == os.stat(canonical).st_ino
    pending, completed = producer.events
    assert isinstance(pending, DownloadPending) and isinstance(completed, DownloadCompleted)
    assert completed.total_bytes == staged.stat().st_size
    assert telemetry and isinstance(telemetry[-1][1], DownloadProgress)

    # Staged already: reported completed once, no network.
    seen = len(mock_hub.requests)
    again, again_producer = _store_worker(tmp_path, {card.model_id: card}, _self_binding(tmp_path))
    await again.downloads.resolve(card.model_id)
    assert [type(e) for e in again_producer.events] == [DownloadCompleted]
    assert len(mock_hub.requests) == seen


async def test_an_unreachable_store_falls_back_to_a_direct_download_and_says_so_once(mock_hub, tmp_path, monkeypatch,
                                                                                      caplog):
    import functools

    import skulk.worker.downloads as worker_downloads
    from skulk.model_store.host import StoreAddress, StoreChoice
    from skulk.model_store.node_store import NodeStore, StoreBinding
    from skulk.model_store.staging import RetryPolicy
    from tests.nodeproc import free_port

    monkeypatch.setattr(worker_downloads, "stage_card", functools.partial(
        worker_downloads.stage_card, retry=RetryPolicy(max_attempts=1), fetch_poll_s=0.01))
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    store = NodeStore(staging_root=tmp_path / "staging", canonical_root=None, free_bytes=lambda _p: 10**15)
    binding = StoreBinding(store, StoreChoice(StoreAddress("127.0.0.1", free_port()), "master", False))
    worker, producer = _store_worker(tmp_path, {card.model_id: card}, binding)

    await worker.downloads.resolve(card.model_id)
    await worker.downloads.resolve(card.model_id)

    direct = tmp_path / "models" / "mock-org--tiny-llama-GGUF" / GGUF_FILE
    assert worker.stats()["artifacts"][card.model_id] == str(direct)
    assert [type(e) for e in producer.events][:2] == [DownloadPending, DownloadCompleted]
    assert sum("MODEL STORE UNREACHABLE" in r.getMessage() for r in caplog.records) == 1
