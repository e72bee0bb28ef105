"""An MLX model pipelined across two real nodes: placement stamps ring hosts, each node's runner
joins the ring, and a chat through either node's API decodes exactly what one rank does."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.cluster.harness import start_linked, wait_agreed
from tests.nodeproc import NodeProcess, wait_for

pytestmark = pytest.mark.timeout(300)

MODEL = "local/tiny-llama"
READY_DEADLINE_S = 120.0
"""A hang guard: two runners import mlx and warm up the group on a loaded 2-core machine."""
MESSAGES = [{"role": "user", "content": "What is a node?"}]


def one_rank_text(tmp_path) -> str:
    from skulk.artifacts.resolve import ensure_local_model
    from skulk.models.cards import builtin_cards_dir, load_card
    from skulk.shared.types.tasks import TextGenerationParams
    from skulk.worker.engines.base import ShardSpec
    from skulk.worker.engines.mlx.engine import MlxEngine
    from tests.worker.engines.mlx_ranks import local_instance

    card = load_card(builtin_cards_dir() / "local--tiny-llama.toml")
    instance = local_instance(card, 1)
    engine = MlxEngine()
    engine.load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=card,
                          model_path=str(ensure_local_model(card, tmp_path / "models"))))
    params = TextGenerationParams(model_id=card.model_id, messages=MESSAGES, max_tokens=20, temperature=0)
    return "".join(t.text for t in engine.generate(params, threading.Event()))


def place_two_nodes(node: NodeProcess, excluded: tuple[str, ...] = ()) -> dict:
    """Place across two nodes (none of `excluded`) until the master has created the instance:
    the API's pre-check can pass while the master, whose resource readings lag its own way,
    still refuses as pending."""
    def placed():
        body = {"modelId": MODEL, "minNodes": 2, "excludedNodes": list(excluded)}
        response = httpx.post(node.url + "/place_instance", json=body, timeout=10)
        if response.status_code == 503:  # resources or edges still gossiping
            return None
        assert response.status_code == 200, response.text
        preview = response.json()["preview"]
        try:
            wait_for(lambda: preview["instanceId"] in node.get("/state").json()["instances"], timeout_s=10,
                     interval_s=0.25, what="the master to create the instance")
        except TimeoutError:
            return None  # refused by the master (pending): place again
        return preview

    return wait_for(placed, timeout_s=90, interval_s=0.5, what="a two-node placement")


def test_two_node_pipeline_chats_like_one_rank(spawn_node, tmp_path) -> None:
    expected = one_rank_text(tmp_path)
    nodes = start_linked(spawn_node, ["mlx-a", "mlx-b"])
    wait_agreed(nodes, members=2)
    # Ring hosts come from the nodes' reported networks: place once both have gossiped.
    wait_for(lambda: len(nodes[0].get("/state").json()["nodeNetwork"]) == 2, timeout_s=60,
             interval_s=0.25, what="both nodes' networks in State")
    preview = place_two_nodes(nodes[0])
    assert len({s["nodeId"] for s in preview["shards"]}) == 2
    assert len(preview["ringHosts"]) == 2  # placement chose where each rank listens

    def ready():
        state = nodes[0].get("/state").json()
        statuses = [r["state"] for r in state["runners"].values()]
        assert "Failed" not in statuses, state["runners"]
        return len(statuses) == 2 and all(s == "Ready" for s in statuses)

    try:
        wait_for(ready, timeout_s=READY_DEADLINE_S, interval_s=0.5, what="both ranks Ready")
    except TimeoutError as exc:
        runners = nodes[0].get("/state").json()["runners"]
        logs = "\n".join(n.log()[-5000:] for n in nodes)
        raise AssertionError(f"{exc}; runners {runners}\n{logs}") from None
    for node in nodes:  # either node's API reaches rank 0
        response = httpx.post(node.url + "/v1/chat/completions", timeout=60, json={
            "model": MODEL, "messages": MESSAGES, "max_tokens": 20, "temperature": 0,
        })
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == expected
