"""A whole-cluster restart (power cut, upgrade) with real node processes: after both nodes of
a 2-node cluster stop and start again on their data directories, the custom card and the
placed instance are back and serve, without an operator action. Node ids change on restart;
the operator's exclusion is kept by node name.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.cluster.harness import node_id, wait_agreed
from tests.mockhub import tiny_artifacts  # noqa: F401 - fixture
from tests.nodeproc import NodeProcess, free_port, wait_for

pytestmark = pytest.mark.timeout(300)

CUSTOM = "local/restored-gguf"
PROMPT = [{"role": "user", "content": "hi"}]
DEADLINE_S = 120.0
"""Hang guard: two node starts, an election, the restore's settling grace and a llama.cpp load
on a loaded 2-core machine."""


def _start(spawn, tmp_path, ports: dict[str, int], listen: dict[str, int], models_dir) -> dict[str, NodeProcess]:
    """Both nodes, the local model's directory allowed for `/models/add` (secure default: only
    the models dir and `models.local_dirs`)."""
    first = f"tcp/127.0.0.1:{listen['cold-a']}"
    nodes = {}
    for name in ("cold-a", "cold-b"):
        args = ["--listen", f"tcp/127.0.0.1:{listen[name]}", "--cluster-key", "cold-key", "--node-name", name]
        if name != "cold-a":
            args += ["--bootstrap-peers", first]
        nodes[name] = spawn(name, data_dir=tmp_path / name, extra_args=args, port=ports[name],
                            env={"SKULK_MODELS_LOCAL_DIRS": str(models_dir)})
    for node in nodes.values():
        node.wait_ready()
    wait_agreed(list(nodes.values()), members=2)
    return nodes


def _serving(node: NodeProcess) -> dict | None:
    state = node.get("/state").json()
    mine = [i for i in state["instances"].values() if i["modelId"] == CUSTOM]
    if len(mine) != 1 or not all(state["runners"].get(s["runnerId"], {}).get("state") == "Ready"
                                 for s in mine[0]["shards"]):
        return None
    return mine[0]


def _chat(node: NodeProcess) -> bool:
    reply = httpx.post(node.url + "/v1/chat/completions", timeout=60,
                       json={"model": CUSTOM, "messages": PROMPT, "max_tokens": 4})
    return reply.status_code == 200 and bool(reply.json()["choices"][0]["message"]["content"])


def test_a_cold_restart_brings_back_the_custom_card_and_the_placement(spawn_node, tmp_path, tiny_artifacts) -> None:
    ports = {n: free_port() for n in ("cold-a", "cold-b")}
    listen = {n: free_port() for n in ("cold-a", "cold-b")}
    nodes = _start(spawn_node, tmp_path, ports, listen, tiny_artifacts.gguf_path.parent)
    a, b = nodes["cold-a"], nodes["cold-b"]
    added = httpx.post(a.url + "/models/add", json={"path": str(tiny_artifacts.gguf_path), "modelId": CUSTOM},
                       timeout=60)
    assert added.status_code == 200 and added.json()["applied"], added.text

    def placed() -> bool:
        body = {"modelId": CUSTOM, "minNodes": 1, "excludedNodes": [node_id(a)]}
        return httpx.post(a.url + "/place_instance", json=body, timeout=10).status_code == 200

    wait_for(placed, timeout_s=DEADLINE_S, interval_s=0.5, what="the placement")
    before = wait_for(lambda: _serving(a), timeout_s=DEADLINE_S, interval_s=0.5, what="the instance Ready")
    assert before["shards"][0]["nodeId"] == node_id(b)
    assert _chat(a)

    for node in (b, a):  # the whole cluster goes down
        node.stop()
    restarted_at = time.monotonic()
    nodes = _start(spawn_node, tmp_path, ports, listen, tiny_artifacts.gguf_path.parent)
    a, b = nodes["cold-a"], nodes["cold-b"]
    try:
        after = wait_for(lambda: _serving(a), timeout_s=DEADLINE_S, interval_s=0.5, what="the restored instance Ready")
        wait_for(lambda: _chat(a), timeout_s=DEADLINE_S, interval_s=0.5, what="a chat on the restored model")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{a.log()[-5000:]}\n{b.log()[-3000:]}") from None
    served_s = time.monotonic() - restarted_at
    state = a.get("/state").json()
    assert CUSTOM in state["customCards"]
    assert after["instanceId"] != before["instanceId"]
    assert [s["nodeId"] for s in after["shards"]] == [node_id(b)]  # the exclusion of cold-a, by name
    assert after["excludedNodes"] == [node_id(a)]
    print(f"\ncold restart: custom card and instance back, chat served {served_s:.1f}s after the restart began")
