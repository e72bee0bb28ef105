"""A placement's KV cache type on a real node: `GET /instance/previews?kvCacheType=` shows
the planner's window for it, `skulk place --kv-cache q8_0` places it, the runner loads its
cache as q8_0 (its log says so) and answers, on llama.cpp and on MLX (mlx-lm's quantized cache,
on one node and on both ranks of a two-node pipeline);
a name that is no type is a 400 that says why. (A type no engine of a card can hold is refused
before anything runs: tests/master/test_placement_kv_cache.py.)"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.cluster.harness import start_linked, wait_agreed
from tests.e2e.test_openai_serving import MODEL, client, place, wait_instance_ready
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(300)

MLX_MODEL = "local/tiny-llama"


def test_a_q8_0_placement_is_previewed_placed_loaded_and_served(spawn_node):
    (node,) = start_linked(spawn_node, ["kv"])
    wait_agreed([node], members=1)

    def previews(kv_type: str) -> httpx.Response | None:
        response = node.get(f"/instance/previews?modelId={MODEL}&kvCacheType={kv_type}")
        return None if response.status_code == 200 and not response.json()["previews"] else response

    shown = wait_for(lambda: previews("q8_0"), timeout_s=60, interval_s=0.5, what="previews")
    assert shown.status_code == 200 and shown.json()["previews"][0]["kvCacheType"] == "q8_0"
    bad = previews("q5_9")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_kv_cache_type"
    assert "f16, q8_0, q4_0" in bad.json()["error"]["message"]

    placed = subprocess.run([sys.executable, "-m", "skulk", "place", MODEL, "--kv-cache", "q8_0", "--url", node.url],
                            capture_output=True, text=True, timeout=120)
    assert placed.returncode == 0, placed.stderr
    assert "q8_0 KV cache" in placed.stdout
    instance_id = placed.stdout.split("placed ", 1)[1].split(":", 1)[0]
    body = wait_instance_ready(node, instance_id)
    assert [s["kvCacheType"] for s in body["shards"]] == ["q8_0"]
    wait_for(lambda: "kv_cache=q8_0" in node.log() or "q8_0 KV cache" in node.log(), timeout_s=30,
             what="the runner's load line")

    reply = client(node).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=8, temperature=0)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 8


def test_an_mlx_model_placed_with_a_q8_0_cache_loads_it_and_chats(spawn_node):
    (node,) = start_linked(spawn_node, ["kvmlx"])
    wait_agreed([node], members=1)
    placed = place(node, modelId=MLX_MODEL, kvCacheType="q8_0")
    ready = wait_instance_ready(node, placed["instanceId"])
    assert [s["kvCacheType"] for s in ready["shards"]] == ["q8_0"]
    # The runner built mlx-lm's quantized cache: 8 bits, grouped by 32 (the tiny heads' width).
    wait_for(lambda: "kv_cache=q8_0 (8-bit, groups of 32)" in node.log(), timeout_s=30, what="the runner's load line")

    chat = client(node)
    reply = chat.chat.completions.create(model=MLX_MODEL, messages=[{"role": "user", "content": "Hi"}],
                                         max_tokens=8, temperature=0)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 8
    # A follow-up re-uses the quantized prefix and still answers.
    again = chat.chat.completions.create(
        model=MLX_MODEL, max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": reply.choices[0].message.content},
                  {"role": "user", "content": "And then?"}])
    assert again.usage.completion_tokens == 8


def test_an_mlx_pipeline_over_two_nodes_runs_q8_0_on_both(spawn_node):
    """Both ranks of a two-node MLX pipeline build the q8_0 cache, and the group answers."""
    nodes = start_linked(spawn_node, ["kvpipe-a", "kvpipe-b"])
    wait_agreed(nodes, members=2)
    wait_for(lambda: len(nodes[0].get("/state").json()["nodeNetwork"]) == 2, timeout_s=60, interval_s=0.25,
             what="both nodes' network in State")
    placed = place(nodes[0], modelId=MLX_MODEL, kvCacheType="q8_0", minNodes=2)
    ready = wait_instance_ready(nodes[0], placed["instanceId"])
    assert len({s["nodeId"] for s in ready["shards"]}) == 2
    assert [s["kvCacheType"] for s in ready["shards"]] == ["q8_0", "q8_0"]
    for node in nodes:
        wait_for(lambda node=node: "kv_cache=q8_0 (8-bit, groups of 32)" in node.log(), timeout_s=30,
                 what=f"{node} rank's load line")
    reply = client(nodes[1]).chat.completions.create(model=MLX_MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=8, temperature=0)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 8
