"""The store choice as the node binds it, the store host's hub fetches on behalf of staging
nodes, and `stage_card` end to end: a real store-host app on a loopback socket, the mock
hub behind it, and a staging node's roots in a temporary directory."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import httpx
import pytest

from skulk.api.app import ApiContext, create_app
from skulk.datadir.config import ModelStoreSection
from skulk.datadir.paths import SkulkPaths
from skulk.model_store.fetch import FAILURE_TTL_S, StoreFetcher, request_fetch, stage_card
from skulk.model_store.host import StoreAddress, StoreChoice
from skulk.model_store.node_store import NodeStore, StoreBinding, bind_store
from skulk.model_store.staging import RetryPolicy, StagingFailed
from skulk.models.downloads import MARKER_FILE_NAME, DownloadFailed, DownloadMarker
from skulk.shared.types.state import State
from tests.api.live_server import free_port, live_server
from tests.mockhub import (
    GGUF_FILE,
    TINY_GGUF_REPO,
    hub_card,
    mock_hub,  # noqa: F401 - fixture
    tiny_artifacts,  # noqa: F401 - fixture
)

FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.01, deadline_s=30)
PLENTY = 10**15
DIR_NAME = "mock-org--tiny-llama-GGUF"


def paths(tmp_path: Path) -> SkulkPaths:
    return SkulkPaths(data_home=tmp_path / "data", models_dir=tmp_path / "data" / "models",
                      cache_home=tmp_path / "cache", custom_cards_dir=tmp_path / "cards")


# -- bind_store: the rule chain as the node runs it -------------------------------------------

OWN = StoreAddress("10.0.0.1", 52415)


@pytest.mark.parametrize(("explicit", "master_endpoint", "own", "expected"), [
    # explicit beats the master, and names another node
    (StoreAddress("10.0.0.9", 52415), "http://10.0.0.2:52415", OWN, ("10.0.0.9", "explicit", False)),
    # no explicit: the master's advertised endpoint
    (None, "http://10.0.0.2:52415", OWN, ("10.0.0.2", "master", False)),
    # this node is the master: it hosts the store
    (None, "http://10.0.0.1:52415", OWN, ("10.0.0.1", "master", True)),
    # master not known yet: its own bootstrap store
    (None, None, OWN, ("10.0.0.1", "bootstrap", True)),
    # an explicit store naming this very node through another of its names
    (StoreAddress("localhost", 52415), None, OWN, ("localhost", "explicit", True)),
    # no API of its own: it follows the master, never hosts
    (None, "http://10.0.0.2:52415", None, ("10.0.0.2", "master", False)),
])
def test_bind_store_follows_the_rule_chain(tmp_path, explicit, master_endpoint, own, expected):
    p = paths(tmp_path)
    binding = bind_store(p, ModelStoreSection(), explicit=explicit, master_endpoint=master_endpoint, own=own,
                         own_hosts=frozenset({"localhost"}))
    assert binding is not None
    choice = binding.choice
    assert (choice.address.host, choice.source, choice.is_self) == expected
    assert binding.store.canonical_root == (p.models_dir if choice.is_self else None)
    assert binding.store.staging_root == p.data_home / "staging"


def test_bind_store_without_an_api_or_a_store_to_follow_is_none(tmp_path):
    assert bind_store(paths(tmp_path), ModelStoreSection(), explicit=None, master_endpoint=None, own=None) is None


def test_bind_store_takes_the_eviction_policy_from_the_config(tmp_path):
    section = ModelStoreSection(cleanup_on_deactivate=False, staging_keep_recent_gb=1, disk_reserve_gb=2)
    binding = bind_store(paths(tmp_path), section, explicit=None, master_endpoint=None, own=OWN)
    assert binding is not None
    policy = binding.store.policy
    assert (policy.cleanup_on_deactivate, policy.keep_recent_bytes, policy.reserve_bytes) == (False, 2**30, 2 * 2**30)


# -- StoreFetcher (the store host) -------------------------------------------------------------


def write_copy(models_dir: Path, data: bytes = b"gguf-bytes") -> None:
    model_dir = models_dir / DIR_NAME
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / GGUF_FILE).write_bytes(data)
    marker = DownloadMarker(TINY_GGUF_REPO, "c" * 40, False, {GGUF_FILE: len(data)})
    (model_dir / MARKER_FILE_NAME).write_text(json.dumps(marker.to_json()))


class GatedDownload:
    """A fake hub download that waits for the test to release it."""

    def __init__(self, fail: DownloadFailed | None = None) -> None:
        self.calls = 0
        self.release = threading.Event()
        self.finished = threading.Event()
        self.fail = fail

    def __call__(self, card, models_dir, *, on_progress=None, cancel=None):
        self.calls += 1
        if on_progress is not None:
            on_progress(3, 10)
        assert self.release.wait(10)
        try:
            if self.fail is not None:
                raise self.fail
            write_copy(models_dir)
            return models_dir / DIR_NAME / GGUF_FILE
        finally:
            self.finished.set()


def settled(fetcher: StoreFetcher, card, root: Path, timeout_s: float = 10.0):
    """The fetcher's answer once its job has ended: the fake download signals `finished`
    just before the fetcher's thread records the outcome, so poll (with a deadline)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        status = fetcher.request(card, root)
        if status.state != "fetching" or time.monotonic() > deadline:
            return status
        time.sleep(0.01)


def test_fetcher_downloads_once_however_often_asked_then_reports_registered(tmp_path):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    download = GatedDownload()
    fetcher = StoreFetcher(download=download)
    first = fetcher.request(card, tmp_path)
    assert first.state == "fetching" and first.http_status == 202
    for _ in range(3):
        assert fetcher.request(card, tmp_path).state == "fetching"
    download.release.set()
    assert download.finished.wait(10)
    done = settled(fetcher, card, tmp_path)
    assert done.state == "registered" and done.http_status == 200
    assert done.manifest is not None and [f.path for f in done.manifest.files] == [GGUF_FILE]
    assert download.calls == 1


def test_fetcher_reports_a_failure_for_a_while_then_tries_again(tmp_path):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    now = [100.0]
    download = GatedDownload(fail=DownloadFailed(TINY_GGUF_REPO, "the hub has no such file (404)", "not_found"))
    fetcher = StoreFetcher(download=download, clock=lambda: now[0])
    fetcher.request(card, tmp_path)
    download.release.set()
    assert download.finished.wait(10)
    failed = settled(fetcher, card, tmp_path)
    assert (failed.state, failed.kind, failed.http_status) == ("failed", "not_found", 502)
    assert "404" in (failed.reason or "")
    now[0] += FAILURE_TTL_S + 1
    download.finished.clear()
    assert fetcher.request(card, tmp_path).state == "fetching"
    assert download.finished.wait(10) and download.calls == 2


def test_fetcher_answers_registered_at_once_for_a_copy_on_disk(tmp_path):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    write_copy(tmp_path)
    download = GatedDownload()
    assert StoreFetcher(download=download).request(card, tmp_path).state == "registered"
    assert download.calls == 0


# -- request_fetch (the staging node) ----------------------------------------------------------


def test_request_fetch_polls_until_registered_and_relays_progress():
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    answers = iter([
        (202, {"state": "fetching", "downloadedBytes": 0, "totalBytes": 0}),
        (202, {"state": "fetching", "downloadedBytes": 5, "totalBytes": 10}),
        (200, {"state": "registered", "manifest": {"modelId": TINY_GGUF_REPO, "revision": "c" * 40,
                                                   "pinned": False, "files": [{"path": GGUF_FILE, "sizeBytes": 10}]}}),
    ])
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status, body = next(answers)
        return httpx.Response(status, json=body)

    progress: list[tuple[int, int]] = []
    manifest = request_fetch("http://store:1", card, api_key="k", transport=httpx.MockTransport(handler),
                             on_progress=lambda d, t: progress.append((d, t)), sleep=lambda _s: None)
    assert manifest is not None and manifest.total_bytes == 10
    assert progress == [(5, 10)]
    assert seen[0].url.path == f"/store/models/{TINY_GGUF_REPO}/fetch"
    assert seen[0].headers["authorization"] == "Bearer k"
    assert json.loads(seen[0].content)["card"]["modelId"] == TINY_GGUF_REPO


def test_request_fetch_raises_the_hubs_failure():
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    transport = httpx.MockTransport(lambda _r: httpx.Response(502, json={
        "state": "failed", "reason": "the repository does not exist on the hub (404)", "kind": "not_found"}))
    with pytest.raises(DownloadFailed) as caught:
        request_fetch("http://store:1", card, transport=transport, sleep=lambda _s: None)
    assert caught.value.kind == "not_found" and "404" in caught.value.reason


def test_request_fetch_of_a_silent_store_is_unreachable():
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(StagingFailed) as caught:
        request_fetch("http://store:1", card, transport=httpx.MockTransport(refuse), sleep=lambda _s: None)
    assert caught.value.kind == "unreachable"


# -- stage_card, end to end over real sockets --------------------------------------------------


def store_host_app(models_dir: Path, staging_root: Path, cards: dict):
    store = NodeStore(staging_root=staging_root, canonical_root=models_dir, free_bytes=lambda _p: PLENTY)
    context = ApiContext(node_id="a", node_name="a", get_state=State, get_cards=lambda: cards, store=store)
    return create_app(context)


def remote_binding(tmp_path: Path, url: str) -> StoreBinding:
    host, port = url.removeprefix("http://").split(":")
    store = NodeStore(staging_root=tmp_path / "b" / "staging", canonical_root=None, free_bytes=lambda _p: PLENTY)
    return StoreBinding(store, StoreChoice(StoreAddress(host, int(port)), "master", False))


def test_a_node_stages_from_a_store_that_first_fetches_from_the_hub(tmp_path, mock_hub):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    app = store_host_app(tmp_path / "a" / "models", tmp_path / "a" / "staging", {card.model_id: card})
    with live_server(app) as url:
        binding = remote_binding(tmp_path, url)
        artifact = stage_card(binding, card, retry=FAST, fetch_poll_s=0.05)
        again = stage_card(binding, card, retry=FAST, fetch_poll_s=0.05)
    assert artifact == again == tmp_path / "b" / "staging" / DIR_NAME / GGUF_FILE
    assert artifact.read_bytes() == (tmp_path / "a" / "models" / DIR_NAME / GGUF_FILE).read_bytes()
    assert [r.range for r in mock_hub.file_requests(GGUF_FILE)] == [None]  # fetched once, by the store


def test_the_store_host_stages_by_hardlink_after_downloading_into_its_store(tmp_path, mock_hub):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    store = NodeStore(staging_root=tmp_path / "staging", canonical_root=tmp_path / "models",
                      free_bytes=lambda _p: PLENTY)
    binding = StoreBinding(store, StoreChoice(OWN, "bootstrap", True))
    artifact = stage_card(binding, card)
    canonical = tmp_path / "models" / DIR_NAME / GGUF_FILE
    assert artifact == tmp_path / "staging" / DIR_NAME / GGUF_FILE
    assert os.stat(artifact).st_ino == os.stat(canonical).st_ino and os.stat(artifact).st_nlink == 2


def test_a_hub_failure_on_the_store_host_reaches_the_staging_node(tmp_path, mock_hub):
    card = hub_card("mock-org/no-such-repo", gguf_file=GGUF_FILE)
    app = store_host_app(tmp_path / "a" / "models", tmp_path / "a" / "staging", {})  # the asker's card is used
    with live_server(app) as url, pytest.raises(DownloadFailed) as caught:
        stage_card(remote_binding(tmp_path, url), card, retry=FAST, fetch_poll_s=0.05)
    assert caught.value.kind == "not_found"


def test_an_unreachable_store_says_so(tmp_path):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    binding = remote_binding(tmp_path, f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StagingFailed) as caught:
        stage_card(binding, card, retry=FAST, fetch_poll_s=0.01)
    assert caught.value.kind == "unreachable"
