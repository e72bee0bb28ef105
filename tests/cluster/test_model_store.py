"""The model store wired into real node processes, against the mock Hugging Face Hub:

- a single node is its own bootstrap store: a placed hub model is downloaded into the
  canonical models dir and staged by hardlink (same inode, no extra disk);
- in a two-node cluster the master is the store host: a model placed on the other node is
  fetched from the hub once, by the store host, and staged over HTTP from its store;
- `DELETE /store/models/{id}` on the store host evicts the other node's staged copy.
"""

from __future__ import annotations

import json
import os

import httpx

from tests.cluster.harness import node_id, wait_agreed
from tests.mockhub import (
    GGUF_FILE,
    TINY_GGUF_REPO,
    mock_hub,  # noqa: F401 - fixture
    tiny_artifacts,  # noqa: F401 - fixture
)
from tests.nodeproc import NodeProcess, free_port, wait_for

DEADLINE_S = 75.0
"""A hang guard per step: node start, a 5 MB transfer and a llama.cpp load on a loaded 2-core box."""
DIR_NAME = "mock-org--tiny-llama-GGUF"
KEY = "store-test-cluster-key"


def _fail_with_logs(exc: Exception, nodes: list[NodeProcess]) -> AssertionError:
    logs = "\n".join(f"--- {n.data_dir.name} ---\n{n.log()[-5000:]}" for n in nodes)
    return AssertionError(f"{exc}\n{logs}")


def _add_card(node: NodeProcess) -> None:
    added = httpx.post(node.url + "/models/add", json={"modelId": TINY_GGUF_REPO}, timeout=60, headers=node.auth)
    assert added.status_code == 200, added.text
    assert added.json()["card"]["ggufFile"] == GGUF_FILE


def _place(node: NodeProcess, nodes: list[NodeProcess], excluded: list[str] = ()) -> str:
    def placed():
        response = httpx.post(node.url + "/place_instance", timeout=10, headers=node.auth,
                              json={"modelId": TINY_GGUF_REPO, "excludedNodes": list(excluded)})
        if response.status_code in (404, 503):  # the card or resources still spreading
            return None
        assert response.status_code == 200, response.text
        return response.json()["instanceId"]

    try:
        return wait_for(placed, timeout_s=DEADLINE_S, interval_s=0.5, what="placement")
    except TimeoutError as exc:
        raise _fail_with_logs(exc, nodes) from None


def _chat(node: NodeProcess, nodes: list[NodeProcess]) -> dict:
    def answered():
        reply = httpx.post(node.url + "/v1/chat/completions", timeout=60, headers=node.auth, json={
            "model": TINY_GGUF_REPO, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        return reply.json() if reply.status_code == 200 else None

    try:
        reply = wait_for(answered, timeout_s=DEADLINE_S, interval_s=0.5, what="a chat answer")
    except TimeoutError as exc:
        raise _fail_with_logs(exc, nodes) from None
    assert reply["choices"][0]["message"]["content"]
    return reply


def _full_file_gets(hub) -> list:
    """Whole-file transfers of the GGUF (the card builder's header probe is a Range read)."""
    return [r for r in hub.file_requests(GGUF_FILE) if r.range != "bytes=0-1048575"]


def test_single_node_stages_a_placed_hub_model_by_hardlink(spawn_node, mock_hub):
    node = spawn_node("solo", env={"HF_ENDPOINT": mock_hub.url})
    node.wait_ready()
    wait_for(lambda: node.get("/v1/cluster").json().get("masterNodeId"), timeout_s=DEADLINE_S, what="a master")
    _add_card(node)
    _place(node, [node])
    _chat(node, [node])

    canonical = node.data_dir / "models" / DIR_NAME / GGUF_FILE
    staged = node.data_dir / "staging" / DIR_NAME / GGUF_FILE
    assert canonical.is_file() and staged.is_file(), node.log()[-4000:]
    c, s = os.stat(canonical), os.stat(staged)
    assert (s.st_dev, s.st_ino) == (c.st_dev, c.st_ino)  # one file, two names: no extra disk
    assert s.st_nlink >= 2
    assert len(_full_file_gets(mock_hub)) == 1

    # The node's store knows the canonical copy and the staged one (which frees nothing).
    listed = node.get("/store/models").json()["models"]
    assert [m["modelId"] for m in listed] == [TINY_GGUF_REPO]
    storage = node.get("/store/storage").json()["nodes"][0]
    assert storage["isStoreHost"] is True
    assert [e["modelId"] for e in storage["staged"]] == [TINY_GGUF_REPO]
    assert storage["stagedOwnBytes"] == 0


def _two_nodes(spawn_node, hub, env: dict | None = None) -> tuple[NodeProcess, NodeProcess, str, str]:
    """A starts alone and becomes master (the store host); B joins it (never churns the
    master) and adopts A's store."""
    port_a, port_b = free_port(), free_port()
    env = {"HF_ENDPOINT": hub.url, **(env or {})}
    a = spawn_node("a", env=env, extra_args=["--listen", f"tcp/127.0.0.1:{port_a}", "--cluster-key", KEY,
                                             "--node-name", "a"])
    a.wait_ready()
    a_id = node_id(a)
    try:
        wait_for(lambda: a.get("/v1/cluster").json().get("masterNodeId") == a_id, timeout_s=DEADLINE_S,
                 what="A elected")
    except TimeoutError as exc:
        raise _fail_with_logs(exc, [a]) from None
    b = spawn_node("b", env=env, extra_args=["--listen", f"tcp/127.0.0.1:{port_b}", "--cluster-key", KEY,
                                             "--node-name", "b", "--bootstrap-peers", f"tcp/127.0.0.1:{port_a}"])
    b.wait_ready()
    view = wait_agreed([a, b], members=2, timeout_s=DEADLINE_S)
    assert view["masterNodeId"] == a_id
    b_id = node_id(b)
    # B follows the master's store: it hosts none itself.
    try:
        wait_for(lambda: b.get("/store/models").status_code == 404, timeout_s=20, what="B adopting A's store")
    except TimeoutError as exc:
        raise _fail_with_logs(exc, [a, b]) from None
    return a, b, a_id, b_id


def _serve_on_b(a: NodeProcess, b: NodeProcess, a_id: str) -> str:
    _add_card(a)
    instance_id = _place(a, [a, b], excluded=[a_id])
    _chat(b, [a, b])
    return instance_id


def test_follower_stages_from_the_master_store_and_the_hub_is_fetched_once(spawn_node, mock_hub):
    a, b, a_id, _b_id = _two_nodes(spawn_node, mock_hub)
    _serve_on_b(a, b, a_id)

    staged_b = b.data_dir / "staging" / DIR_NAME / GGUF_FILE
    canonical_a = a.data_dir / "models" / DIR_NAME / GGUF_FILE
    assert staged_b.is_file() and canonical_a.is_file()
    assert staged_b.read_bytes() == canonical_a.read_bytes()
    assert not (b.data_dir / "models" / DIR_NAME).exists()  # B never downloaded from the hub
    assert len(_full_file_gets(mock_hub)) == 1, mock_hub.file_requests(GGUF_FILE)
    assert "MODEL STORE UNREACHABLE" not in b.log()
    # A's store serves the manifest B staged from.
    manifest = a.get(f"/store/models/{TINY_GGUF_REPO}").json()
    assert [f["path"] for f in manifest["files"]] == [GGUF_FILE]
    # B remembers the master's store for its next start (the startup window before a master speaks).
    remembered = json.loads((b.data_dir / "store-choice.json").read_text())
    assert (remembered["host"], remembered["port"]) == ("127.0.0.1", a.api_port), remembered


def test_staging_works_with_keys_required_from_every_client(spawn_node, mock_hub):
    """Credentials on everywhere (loopback too), each node with its own API key: B stages
    from A's store with the peer token both derive from the cluster key."""
    a, b, a_id, _b_id = _two_nodes(spawn_node, mock_hub, env={"SKULK_API_REQUIRE_KEY_ON_LOOPBACK": "1"})
    assert a.api_key != b.api_key
    assert httpx.get(a.url + "/store/models", timeout=5).status_code == 401
    _serve_on_b(a, b, a_id)
    staged_b = b.data_dir / "staging" / DIR_NAME / GGUF_FILE
    assert staged_b.is_file() and not (b.data_dir / "models" / DIR_NAME).exists()
    assert "MODEL STORE UNREACHABLE" not in b.log()


def test_deleting_a_model_from_the_store_evicts_the_followers_staged_copy(spawn_node, mock_hub):
    a, b, a_id, b_id = _two_nodes(spawn_node, mock_hub)
    instance_id = _serve_on_b(a, b, a_id)
    staged_dir = b.data_dir / "staging" / DIR_NAME
    assert staged_dir.is_dir()

    # A copy a live runner uses is kept; stop the instance first.
    assert httpx.delete(f"{a.url}/instance/{instance_id}", timeout=10).status_code == 200
    wait_for(lambda: not b.get("/state").json()["instances"], timeout_s=DEADLINE_S, what="instance gone")
    assert staged_dir.is_dir()  # the recency pass keeps a recently used copy within budget

    deleted = httpx.delete(f"{a.url}/store/models/{TINY_GGUF_REPO}", timeout=30)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["removedCanonical"] == [DIR_NAME]
    try:
        wait_for(lambda: not staged_dir.exists(), timeout_s=30, what="B's staged copy evicted")
    except TimeoutError as exc:
        raise _fail_with_logs(exc, [a, b]) from None
    assert not (a.data_dir / "models" / DIR_NAME).exists()
    wait_for(lambda: TINY_GGUF_REPO not in b.get("/state").json()["downloads"].get(b_id, {}), timeout_s=20,
             what="B's download record cleared")


def test_an_invalid_store_host_stops_the_node_with_a_usage_error(spawn_node, tmp_path):
    data = tmp_path / "bad"
    data.mkdir()
    (data / "skulk.yaml").write_text("model_store:\n  store_host: ftp://store.example\n")
    node = spawn_node("bad", data_dir=data)
    assert node.wait_exit(timeout_s=60) == 2
    assert "store_host" in node.log()
