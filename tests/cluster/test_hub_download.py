"""A real node adds a model from a (mock) Hugging Face Hub, downloads it when it is placed,
records the download in State, and serves it: the whole download path in one process."""

from __future__ import annotations

import httpx

from tests.mockhub import (
    GGUF_FILE,
    TINY_GGUF_REPO,
    mock_hub,  # noqa: F401 - fixture
    tiny_artifacts,  # noqa: F401 - fixture
)
from tests.nodeproc import wait_for

DEADLINE_S = 90.0
"""A hang guard: starting the node, a 5 MB download and a llama.cpp load on a loaded 2-core box."""


def test_node_downloads_a_placed_hub_model_and_serves_it(spawn_node, mock_hub):
    node = spawn_node("solo", env={"HF_ENDPOINT": mock_hub.url})
    node.wait_ready()
    wait_for(lambda: node.get("/v1/cluster").json().get("masterNodeId"), timeout_s=DEADLINE_S, what="a master")
    added = httpx.post(node.url + "/models/add", json={"modelId": TINY_GGUF_REPO}, timeout=60)
    assert added.status_code == 200, added.text
    assert added.json()["card"]["ggufFile"] == GGUF_FILE and added.json()["applied"] is True

    def placed():
        response = httpx.post(node.url + "/place_instance", json={"modelId": TINY_GGUF_REPO}, timeout=10)
        if response.status_code == 503:  # resources still gossiping, or the card not yet applied
            return None
        assert response.status_code == 200, response.text
        return response.json()["instanceId"]

    wait_for(placed, timeout_s=DEADLINE_S, interval_s=0.5, what="placement")

    def answered():
        reply = httpx.post(node.url + "/v1/chat/completions", timeout=60, json={
            "model": TINY_GGUF_REPO, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        return reply.json() if reply.status_code == 200 else None

    try:
        reply = wait_for(answered, timeout_s=DEADLINE_S, interval_s=0.5, what="a chat answer")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{node.log()[-6000:]}") from None
    assert reply["choices"][0]["message"]["content"]

    node_id = node.get("/node_id").json()
    node_id = node_id["nodeId"] if isinstance(node_id, dict) else node_id
    status = node.get("/state").json()["downloads"][node_id][TINY_GGUF_REPO]
    repo = mock_hub.repos[TINY_GGUF_REPO]
    assert status["type"] == "DownloadStatusCompleted"
    assert status["totalBytes"] == len(repo.commits[repo.main][GGUF_FILE])
    assert (node.data_dir / "models" / "mock-org--tiny-llama-GGUF" / GGUF_FILE).is_file()
    gets = mock_hub.file_requests(GGUF_FILE)
    assert [r.range for r in gets] == ["bytes=0-1048575", None]  # the header for the card, then the file
