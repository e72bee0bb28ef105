"""Any architecture the engines load is served: tiny random GGUFs of architectures beyond the
built-in seven (a mixture of experts among them) are added from a local path, placed and
answered through the official OpenAI SDK on a real node; the MoE model pooled over two nodes
gives one node's greedy tokens; an architecture no engine loads is refused by name."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from skulk.models.card_builder import card_from_gguf, parse_gguf_header
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.tasks import TextGenerationParams
from tests.cluster.harness import start_linked, wait_agreed
from tests.nodeproc import NodeProcess, wait_for
from tests.tiny_archs import MOE_ARCH, TINY_ARCHS, write_tiny_arch_gguf
from tests.tiny_mlx_archs import MLX_MOE_TYPE, TINY_MLX_TYPES, write_tiny_mlx_model
from tests.worker.tiny_gguf import tiny_instance

pytestmark = pytest.mark.timeout(600)

PROMPT = "the the the the"
MAX_TOKENS = 12
READY_DEADLINE_S = 180.0
ENV = {"SKULK_NO_ENGINE_AUTOPROVISION": "1"}


def models_dir(tmp_path: Path) -> Path:
    root = tmp_path / "archs"
    root.mkdir()
    for arch in TINY_ARCHS:
        write_tiny_arch_gguf(root / f"tiny-{arch}.gguf", arch)
    return root


def add_local(node: NodeProcess, path: Path) -> dict:
    response = httpx.post(node.url + "/models/add", json={"path": str(path)}, timeout=60, headers=node.auth)
    assert response.status_code == 200, response.text
    return response.json()["card"]


def place(node: NodeProcess, model_id: str, min_nodes: int = 1) -> str:
    def placed():
        response = httpx.post(node.url + "/place_instance", json={"modelId": model_id, "minNodes": min_nodes},
                              timeout=10, headers=node.auth)
        if response.status_code in (404, 503):  # the card or resources still spreading
            return None
        assert response.status_code == 200, response.text
        return response.json()["instanceId"]

    instance_id = wait_for(placed, timeout_s=90, interval_s=0.5, what=f"{model_id} placed")

    def ready() -> bool:
        state = node.get("/state").json()
        instance = state["instances"].get(instance_id)
        return instance is not None and all(
            state["runners"].get(s["runnerId"], {}).get("state") == "Ready" for s in instance["shards"])

    try:
        wait_for(ready, timeout_s=READY_DEADLINE_S, interval_s=0.5, what=f"{model_id} Ready")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{node.log()[-6000:]}") from None
    return instance_id


def remove(node: NodeProcess, instance_id: str) -> None:
    assert httpx.delete(node.url + f"/instance/{instance_id}", timeout=10, headers=node.auth).status_code == 200
    wait_for(lambda: instance_id not in node.get("/state").json()["instances"], timeout_s=60, interval_s=0.25,
             what="the instance gone")


def openai_chat(node: NodeProcess, model_id: str) -> str:
    client = OpenAI(base_url=node.url + "/v1", api_key="unused", timeout=120, max_retries=0)
    reply = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=MAX_TOKENS, temperature=0)
    assert reply.choices[0].finish_reason in ("length", "stop")
    return reply.choices[0].message.content or ""


def test_every_tiny_architecture_is_added_placed_and_answered(spawn_node, tmp_path):
    root = models_dir(tmp_path)
    node = spawn_node("archs", env={**ENV, "SKULK_MODELS_LOCAL_DIRS": str(root)}).wait_ready()
    answered: dict[str, str] = {}
    for arch in TINY_ARCHS:
        card = add_local(node, root / f"tiny-{arch}.gguf")
        assert card["family"] == arch and card["totalParameters"] > 0, card
        if arch == MOE_ARCH:
            assert (card["numExperts"], card["numExpertsUsed"]) == (4, 2)
            assert card["activeParameters"] < card["totalParameters"]
        instance_id = place(node, card["modelId"])
        answered[arch] = openai_chat(node, card["modelId"])
        remove(node, instance_id)
    assert all(answered.values()), answered


def test_every_tiny_mlx_model_type_is_added_placed_and_answered(spawn_node, tmp_path):
    pytest.importorskip("mlx_lm")
    root = tmp_path / "mlx"
    for model_type in TINY_MLX_TYPES:
        write_tiny_mlx_model(root / f"tiny-{model_type}", model_type)
    node = spawn_node("mlx-types", env={**ENV, "SKULK_MODELS_LOCAL_DIRS": str(root)}).wait_ready()
    answered: dict[str, str] = {}
    for model_type in TINY_MLX_TYPES:
        card = add_local(node, root / f"tiny-{model_type}")
        assert card["family"] == model_type and card["placement"]["compatibleBackends"][0].startswith("mlx"), card
        assert card["totalParameters"] > 0, card
        if model_type == MLX_MOE_TYPE:
            assert (card["numExperts"], card["numExpertsUsed"]) == (4, 2)
            assert card["activeParameters"] < card["totalParameters"]
        instance_id = place(node, card["modelId"])
        answered[model_type] = openai_chat(node, card["modelId"])
        remove(node, instance_id)
    assert all(answered.values()), answered


def test_an_architecture_no_engine_loads_is_refused_by_name(spawn_node, tmp_path):
    root = tmp_path / "odd"
    root.mkdir()
    path = write_tiny_arch_gguf(root / "odd.gguf", "olmo2")
    data = bytearray(path.read_bytes())
    at = data.index(b"olmo2")  # general.architecture comes first; same length keeps the file whole
    data[at:at + 5] = b"olmo9"
    path.write_bytes(bytes(data))
    node = spawn_node("odd", env={**ENV, "SKULK_MODELS_LOCAL_DIRS": str(root)}).wait_ready()
    response = httpx.post(node.url + "/models/add", json={"path": str(path)}, timeout=60, headers=node.auth)
    assert response.status_code == 400, response.text
    assert "architecture 'olmo9' is not one the llama.cpp of llama-cpp-python" in response.text


def one_node_text(path: Path) -> str:
    """The reference: the in-process engine the pool's driver runs, one node, greedy."""
    from skulk.worker.engines.base import ShardSpec
    from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine

    header = parse_gguf_header(path.read_bytes())
    card = card_from_gguf("local/tiny-moe", header.meta, path.name, path.stat().st_size, local_path=str(path.parent),
                          tensor_elements=header.tensor_elements)
    instance = tiny_instance(card)
    engine = LlamaCppEngine()
    engine.load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=card,
                          model_path=str(path), n_threads=1))
    try:
        params = TextGenerationParams(model_id=card.model_id, messages=[ChatMessage(role="user", content=PROMPT)],
                                      max_tokens=MAX_TOKENS, temperature=0.0)
        return "".join(t.text for t in engine.generate(params, threading.Event()))
    finally:
        engine.close()


def test_the_moe_model_pooled_over_two_nodes_gives_one_nodes_tokens(spawn_node, tmp_path):
    root = tmp_path / "moe"
    root.mkdir()
    path = write_tiny_arch_gguf(root / "tiny-moe.gguf", MOE_ARCH)
    expected = one_node_text(path)
    env = {**ENV, "SKULK_MODELS_LOCAL_DIRS": str(root)}
    nodes = start_linked(lambda name, **kw: spawn_node(name, env=env, **kw), ["moe-a", "moe-b"])
    wait_agreed(nodes, members=2)
    wait_for(lambda: len(nodes[0].get("/state").json()["nodeNetwork"]) == 2, timeout_s=60, interval_s=0.25,
             what="both nodes' network in State")
    card = add_local(nodes[0], path)
    instance_id = place(nodes[0], card["modelId"], min_nodes=2)
    shards = nodes[0].get("/state").json()["instances"][instance_id]["shards"]
    assert len({s["nodeId"] for s in shards}) == 2 and all(s["backend"].startswith("llama_cpp") for s in shards)
    reply = httpx.post(nodes[1].url + "/v1/chat/completions", timeout=120, headers=nodes[1].auth, json={
        "model": card["modelId"], "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS,
        "temperature": 0})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == expected
