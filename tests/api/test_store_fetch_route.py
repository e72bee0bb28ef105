"""`POST /store/models/{modelId}/fetch`: the store host fetching a model it lacks."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from skulk.api.app import ApiContext, create_app
from skulk.model_store.node_store import NodeStore
from skulk.shared.types.state import State
from tests.mockhub import (
    GGUF_FILE,
    TINY_GGUF_REPO,
    hub_card,
    mock_hub,  # noqa: F401 - fixture
    tiny_artifacts,  # noqa: F401 - fixture
)


def client(tmp_path, cards, *, store_host: bool = True, store: bool = True) -> TestClient:
    node_store = NodeStore(staging_root=tmp_path / "staging", canonical_root=tmp_path / "models" if store_host else None,
                           free_bytes=lambda _p: 10**15)
    context = ApiContext(node_id="a", node_name="a", get_state=State, get_cards=lambda: cards,
                         store=node_store if store else None)
    return TestClient(create_app(context))


def test_fetch_starts_once_then_answers_the_manifest(tmp_path, mock_hub):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    api = client(tmp_path, {card.model_id: card})
    first = api.post(f"/store/models/{TINY_GGUF_REPO}/fetch", json={})
    assert first.status_code == 202 and first.json()["state"] == "fetching"
    deadline = time.monotonic() + 30
    while (answer := api.post(f"/store/models/{TINY_GGUF_REPO}/fetch", json={})).status_code == 202:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert answer.status_code == 200, answer.text
    assert [f["path"] for f in answer.json()["manifest"]["files"]] == [GGUF_FILE]
    assert [r.range for r in mock_hub.file_requests(GGUF_FILE)] == [None]
    # the manifest route now serves it too
    assert api.get(f"/store/models/{TINY_GGUF_REPO}").status_code == 200


def test_fetch_without_a_card_is_404(tmp_path):
    response = client(tmp_path, {}).post("/store/models/mock-org/unknown/fetch", json={})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_card_not_found"


def test_fetch_on_a_node_that_does_not_host_the_store_is_404(tmp_path):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    response = client(tmp_path, {card.model_id: card}, store_host=False).post(
        f"/store/models/{TINY_GGUF_REPO}/fetch", json={})
    assert response.status_code == 404 and response.json()["error"]["code"] == "no_store_here"


def test_fetch_without_a_store_is_503(tmp_path):
    response = client(tmp_path, {}, store=False).post(f"/store/models/{TINY_GGUF_REPO}/fetch", json={})
    assert response.status_code == 503 and response.json()["error"]["code"] == "store_not_configured"
