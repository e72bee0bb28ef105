"""A placement's KV cache type on a real node: `GET /instance/previews?kvCacheType=` shows
the planner's window for it, `skulk place --kv-cache q8_0` places it, the runner loads its
cache as q8_0 (its log says so) and answers; a type the model's engines cannot hold, or a
name that is no type, is a 400 that says why."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.cluster.harness import start_linked, wait_agreed
from tests.e2e.test_openai_serving import MODEL, client, wait_instance_ready
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(300)


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


def test_a_type_the_engine_cannot_hold_is_refused_before_anything_runs(spawn_node):
    (node,) = start_linked(spawn_node, ["kvbad"])
    wait_agreed([node], members=1)
    response = httpx.post(node.url + "/place_instance", json={"modelId": "local/tiny-llama", "kvCacheType": "q8_0"},
                          timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "kv_cache_type_unsupported" and "mlx engine serves KV cache types f16" in error["message"]
    assert json.loads(node.get("/state").text)["instances"] == {}
