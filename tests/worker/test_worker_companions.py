"""The worker resolving a card with companion repos against the mock hub: a second tiny repo
served as the companion, on the fresh path, the already-on-disk path and store staging; a
draft GGUF fetched only for a card that drafts with it."""

from __future__ import annotations

from skulk.models.downloads import MARKER_FILE_NAME, download_model
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.events import DownloadCompleted, DownloadFailed, DownloadPending
from tests.mockhub import (
    GGUF_FILE,
    TINY_GGUF_REPO,
    TINY_MLX_REPO,
    hub_card,
    mock_hub,  # noqa: F401 - fixture
    tiny_artifacts,  # noqa: F401 - fixture
)
from tests.worker.test_worker_downloads import _self_binding, _store_worker, _worker

MISSING = "mock-org/no-such-companion"
COMPANION_DIR = "mock-org--tiny-llama-mlx"
BASE_DIR = "mock-org--tiny-llama-GGUF"


def card_with(**companions) -> ModelCard:
    base = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    return ModelCard.model_validate({**base.model_dump(by_alias=False), **companions})


async def test_a_required_companion_is_downloaded_before_the_model_is_ready(mock_hub, tmp_path):
    card = card_with(vision_weights_repo=TINY_MLX_REPO)
    worker, producer, _replica, _router = _worker(tmp_path, {card.model_id: card})

    await worker.downloads.resolve(card.model_id)

    assert [type(e) for e in producer.events] == [DownloadPending, DownloadCompleted]
    assert (tmp_path / COMPANION_DIR / MARKER_FILE_NAME).is_file()
    assert worker.stats()["artifacts"][card.model_id] == str(tmp_path / BASE_DIR / GGUF_FILE)
    assert worker.stats()["companionArtifacts"][card.model_id] == {TINY_MLX_REPO: str(tmp_path / COMPANION_DIR)}


async def test_a_missing_required_companion_fails_the_model_naming_it(mock_hub, tmp_path):
    card = card_with(vision_weights_repo=MISSING)
    worker, producer, _replica, _router = _worker(tmp_path, {card.model_id: card})

    await worker.downloads.resolve(card.model_id)

    pending, failed = producer.events
    assert isinstance(pending, DownloadPending) and isinstance(failed, DownloadFailed)
    assert failed.attempt_id == pending.attempt_id and MISSING in failed.error_message
    assert card.model_id not in worker.stats()["artifacts"]
    assert MISSING in worker.downloads.failures[card.model_id].reason


DRAFT_REPO = "mock-org/tiny-llama-draft-GGUF"


def drafting_card(**runtime: str) -> ModelCard:
    return card_with(served_spec_draft_repo=DRAFT_REPO, served_spec_draft_file=GGUF_FILE,
                     served_spec_draft_size_bytes=5_000_000, runtime=runtime)


async def test_a_drafting_cards_draft_gguf_is_downloaded_and_its_path_kept(mock_hub, tiny_artifacts, tmp_path):
    mock_hub.add_repo(DRAFT_REPO, {GGUF_FILE: tiny_artifacts.gguf_path.read_bytes()}, tags=("gguf", "llama"))
    card = drafting_card(speculative="draft")
    worker, producer, _replica, _router = _worker(tmp_path, {card.model_id: card})

    await worker.downloads.resolve(card.model_id)

    assert [type(e) for e in producer.events] == [DownloadPending, DownloadCompleted]
    draft = tmp_path / "mock-org--tiny-llama-draft-GGUF" / GGUF_FILE
    assert draft.is_file()
    assert worker.stats()["companionArtifacts"][card.model_id] == {DRAFT_REPO: str(draft)}


async def test_a_draft_the_card_does_not_draft_with_is_never_downloaded(mock_hub, tiny_artifacts, tmp_path):
    mock_hub.add_repo(DRAFT_REPO, {GGUF_FILE: tiny_artifacts.gguf_path.read_bytes()}, tags=("gguf", "llama"))
    card = drafting_card(speculative="ngram")
    worker, producer, _replica, _router = _worker(tmp_path, {card.model_id: card})

    await worker.downloads.resolve(card.model_id)

    assert [type(e) for e in producer.events] == [DownloadPending, DownloadCompleted]
    assert not (tmp_path / "mock-org--tiny-llama-draft-GGUF").exists()
    assert mock_hub.listing_requests(DRAFT_REPO) == [] and worker.stats()["companionArtifacts"][card.model_id] == {}


async def test_the_on_disk_fast_path_ensures_companions_too(mock_hub, tmp_path):
    card = card_with(vision_weights_repo=TINY_MLX_REPO)
    download_model(hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE), tmp_path)  # the model, not its companion
    worker, producer, _replica, _router = _worker(tmp_path, {card.model_id: card})

    await worker.downloads.resolve(card.model_id)

    assert [type(e) for e in producer.events] == [DownloadCompleted]
    assert (tmp_path / COMPANION_DIR / MARKER_FILE_NAME).is_file()

    missing = card_with(vision_weights_repo=MISSING)
    worker, producer, _replica, _router = _worker(tmp_path, {missing.model_id: missing})
    await worker.downloads.resolve(missing.model_id)
    assert [type(e) for e in producer.events] == [DownloadFailed]
    assert MISSING in producer.events[0].error_message


async def test_companions_are_staged_through_the_store(mock_hub, tmp_path):
    import os

    card = card_with(vision_weights_repo=TINY_MLX_REPO)
    worker, producer = _store_worker(tmp_path, {card.model_id: card}, _self_binding(tmp_path))

    await worker.downloads.resolve(card.model_id)

    assert [type(e) for e in producer.events] == [DownloadPending, DownloadCompleted]
    staged = tmp_path / "staging" / COMPANION_DIR / "config.json"
    canonical = tmp_path / "models" / COMPANION_DIR / "config.json"
    assert os.stat(staged).st_ino == os.stat(canonical).st_ino  # via the store: canonical copy, then a link

    # Staged already, companion included: completed once, nothing asked of the hub.
    seen = len(mock_hub.requests)
    again, again_producer = _store_worker(tmp_path, {card.model_id: card}, _self_binding(tmp_path))
    await again.downloads.resolve(card.model_id)
    assert [type(e) for e in again_producer.events] == [DownloadCompleted]
    assert len(mock_hub.requests) == seen


async def test_a_remote_store_fetches_and_stages_companions_too(mock_hub, tmp_path, monkeypatch):
    """A follower's companion goes through the store like its model: the store host fetches
    it from the hub once (from the derived companion card), the follower stages it."""
    import functools

    import skulk.worker.downloads as worker_downloads
    from tests.api.live_server import live_server
    from tests.model_store.test_store_fetch import FAST, remote_binding, store_host_app

    monkeypatch.setattr(worker_downloads, "stage_card", functools.partial(worker_downloads.stage_card, retry=FAST,
                                                                     fetch_poll_s=0.05))
    card = card_with(vision_weights_repo=TINY_MLX_REPO)
    app = store_host_app(tmp_path / "a" / "models", tmp_path / "a" / "staging", {})  # the asker's cards are used
    with live_server(app) as url:
        worker, producer = _store_worker(tmp_path / "b", {card.model_id: card}, remote_binding(tmp_path, url))
        await worker.downloads.resolve(card.model_id)

    assert [type(e) for e in producer.events] == [DownloadPending, DownloadCompleted]
    for dir_name in (BASE_DIR, COMPANION_DIR):
        assert (tmp_path / "a" / "models" / dir_name / MARKER_FILE_NAME).is_file()  # canonical on the store
        assert (tmp_path / "b" / "staging" / dir_name / MARKER_FILE_NAME).is_file()  # staged on the follower
    assert not (tmp_path / "b" / "models").exists()  # the follower never went to the hub itself
    assert len([r for r in mock_hub.file_requests("config.json") if r.range is None]) == 1
