"""A GGUF model pooled over llama.cpp's RPC backend across 2 and 3 real node processes on
loopback: greedy tokens identical to one node, State showing every rank's layers and memory,
a raw TCP client at every pool port getting nothing; then kill -9 of a donor's runner (2
nodes) or of a donor's whole node (3 nodes) mid-stream ends the client's stream with an error
naming the lost node and rank, and the repaired placement serves the same tokens again."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import sys
import threading

import httpx
import psutil
import pytest

from skulk.pool.layout import pool_port
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.instances import Instance
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.hugepages import HUGEPAGE_MALLOC, thp_mode, weights_in_malloc
from tests.cluster.harness import start_linked, wait_agreed
from tests.llama_server_kit import require_native_rpc_server
from tests.nodeproc import NodeProcess, wait_for
from tests.worker.tiny_gguf import TINY_GGUF_MODEL_ID, tiny_gguf, tiny_gguf_card, tiny_instance  # noqa: F401

pytestmark = pytest.mark.timeout(420)

MODEL = TINY_GGUF_MODEL_ID
PROMPT = "the the the the"
MAX_TOKENS = 24
READY_DEADLINE_S = 180.0
NODE_TIMEOUT_S = 10.0
"""The master's prune timeout in the node-loss test (as tests/cluster/test_node_loss.py)."""
ENV = {"SKULK_NO_ENGINE_AUTOPROVISION": "1"}


def one_node_text(model_path) -> str:
    """The reference: the same request on the in-process engine, one node, greedy."""
    from skulk.worker.engines.base import ShardSpec
    from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine

    card = tiny_gguf_card()
    instance = tiny_instance(card)
    engine = LlamaCppEngine()
    engine.load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=card,
                          model_path=str(model_path), n_threads=1))
    try:
        params = TextGenerationParams(model_id=MODEL, messages=[ChatMessage(role="user", content=PROMPT)],
                                      max_tokens=MAX_TOKENS, temperature=0.0)
        return "".join(t.text for t in engine.generate(params, threading.Event()))
    finally:
        engine.close()


def place_pool(node: NodeProcess, width: int) -> dict:
    def placed():
        response = httpx.post(node.url + "/place_instance", json={"modelId": MODEL, "minNodes": width}, timeout=10)
        if response.status_code == 503:
            return None
        assert response.status_code == 200, response.text
        preview = response.json()["preview"]
        try:
            wait_for(lambda: preview["instanceId"] in node.get("/state").json()["instances"], timeout_s=10,
                     interval_s=0.25, what="the instance")
        except TimeoutError:
            return None
        return preview

    return wait_for(placed, timeout_s=90, interval_s=0.5, what=f"a {width}-node pool")


def ready(node: NodeProcess, instance_id: str) -> bool:
    state = node.get("/state").json()
    instance = state["instances"].get(instance_id)
    return instance is not None and all(
        state["runners"].get(s["runnerId"], {}).get("state") == "Ready" for s in instance["shards"])


def chat(node: NodeProcess) -> str:
    response = httpx.post(node.url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS,
        "temperature": 0,
    })
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def start_pool(spawn_node, width: int, env: dict | None = None) -> tuple[list[NodeProcess], dict]:
    names = [f"pool{width}-{c}" for c in "abc"[:width]]
    nodes = start_linked(lambda name, **kw: spawn_node(name, env={**ENV, **(env or {})}, **kw), names)
    wait_agreed(nodes, members=width)
    wait_for(lambda: len(nodes[0].get("/state").json()["nodeNetwork"]) == width, timeout_s=60, interval_s=0.25,
             what="every node's network in State")
    preview = place_pool(nodes[0], width)
    try:
        wait_for(lambda: ready(nodes[0], preview["instanceId"]), timeout_s=READY_DEADLINE_S, interval_s=0.5,
                 what="every rank Ready")
    except TimeoutError as exc:
        logs = "\n".join(f"--- {n.data_dir.name}\n{n.log()[-5000:]}" for n in nodes)
        raise AssertionError(f"{exc}\n{logs}") from None
    return nodes, preview


def check_pool(nodes: list[NodeProcess], preview: dict, expected: str, width: int) -> Instance:
    """Tokens identical to one node, every rank's layers and memory in State, and every pool
    port answering a stray TCP client with nothing."""
    state = nodes[0].get("/state").json()
    instance = state["instances"][preview["instanceId"]]
    shards = instance["shards"]
    assert len({s["nodeId"] for s in shards}) == width
    assert [s["backend"].split("-")[0] for s in shards] == ["llama_cpp"] * width
    assert shards[0]["startLayer"] == 0 and shards[-1]["endLayer"] == tiny_gguf_card().num_layers
    assert all(s["endLayer"] > s["startLayer"] for s in shards)
    plans = instance["capacity"]["shards"]  # every rank's memory, as placement admitted it
    assert [s["rank"] for s in plans] == list(range(width))
    assert [s["layers"] for s in plans] == [s["endLayer"] - s["startLayer"] for s in shards]
    assert all(s["admittedBytes"] > 0 for s in plans)
    assert chat(nodes[-1]) == expected
    typed = Instance.model_validate(instance)
    for shard in shards[1:]:
        host = typed.ring_hosts[shard["rank"]]
        with socket.create_connection((host, pool_port(typed, shard["rank"])), timeout=5) as sock:
            sock.sendall(b"\x00" * 64)  # as much as a handshake's first message, without the key
            sock.settimeout(10)
            try:
                answer = sock.recv(1024)
            except ConnectionResetError:  # hung up on us: nothing came back either
                answer = b""
            assert answer == b""
    return typed


def stream_until(api: NodeProcess, kill) -> dict:
    """Stream a long greedy chat through `api`; `kill` after three chunks; the error object."""
    killed = threading.Event()
    chunks = 0
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1800,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", api.url + "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                assert killed.is_set(), f"failed before the kill: {event}"
                return event["error"]
            choice = event["choices"][0] if event.get("choices") else {}
            assert choice.get("finish_reason") is None, f"ended before the kill could land: {event}"
            chunks += 1
            if not killed.is_set() and chunks >= 3:
                kill()
                killed.set()
    raise AssertionError("the stream ended without an error")


def serving_again(api: NodeProcess, old_id: str, without: str | None = None) -> dict | None:
    state = api.get("/state").json()
    mine = [i for i in state["instances"].values() if i["modelId"] == MODEL]
    if old_id in state["instances"] or len(mine) != 1:
        return None
    if without is not None and (without in state["nodes"] or without in {s["nodeId"] for s in mine[0]["shards"]}):
        return None
    return mine[0] if ready(api, mine[0]["instanceId"]) else None


def kill_runners(node: NodeProcess) -> None:
    for child in psutil.Process(node.proc.pid).children(recursive=True):
        child.send_signal(signal.SIGKILL)


def kill_node(node: NodeProcess) -> None:
    runners = psutil.Process(node.proc.pid).children(recursive=True)
    node.proc.send_signal(signal.SIGKILL)
    for runner in runners:
        with contextlib.suppress(psutil.NoSuchProcess):
            runner.kill()


def test_two_node_pool_then_kill_9_of_the_donor_runner(spawn_node, tiny_gguf) -> None:
    expected = one_node_text(tiny_gguf)
    nodes, preview = start_pool(spawn_node, 2)
    check_pool(nodes, preview, expected, 2)
    ids = {n.get("/node_id").json()["nodeId"]: n for n in nodes}
    ranks = {s["rank"]: s["nodeId"] for s in preview["shards"]}
    driver, donor = ids[ranks[0]], ids[ranks[1]]
    # Every engine process a node spawns starts with huge-page malloc (worker/engines/hugepages.py).
    for node in (driver, donor):
        runners = psutil.Process(node.proc.pid).children(recursive=True)
        assert runners and all("glibc.malloc.hugetlb=1" in r.environ().get("GLIBC_TUNABLES", "") for r in runners)
    if weights_in_malloc(sys.platform, HUGEPAGE_MALLOC, thp_mode()):  # and so the driver reads its weights
        assert re.search(r"loaded .* mmap=False", driver.log()), driver.log()[-3000:]

    error = stream_until(driver, lambda: kill_runners(donor))
    message = error["message"]
    assert error["code"] == "PoolMemberLost", error
    assert ranks[1] in message and "rank 1" in message and "lost" in message, message
    # A broken group: the master re-places it (fresh instance id) and it serves again.
    wait_for(lambda: serving_again(driver, preview["instanceId"]), timeout_s=READY_DEADLINE_S, interval_s=1.0,
             what="the pool re-placed and Ready")
    assert chat(driver) == expected


def test_three_node_pool_then_kill_9_of_a_donors_node(spawn_node, tiny_gguf) -> None:
    expected = one_node_text(tiny_gguf)
    nodes, preview = start_pool(spawn_node, 3, env={"SKULK_TEST_NODE_TIMEOUT_SECONDS": str(NODE_TIMEOUT_S)})
    check_pool(nodes, preview, expected, 3)
    ids = {n.get("/node_id").json()["nodeId"]: n for n in nodes}
    master_id = nodes[0].get("/v1/cluster").json()["masterNodeId"]
    ranks = {s["rank"]: s["nodeId"] for s in preview["shards"]}
    victim_rank = 2 if ranks[2] != master_id else 1  # no master failover in this test
    victim_id = ranks[victim_rank]
    driver = ids[ranks[0]]

    error = stream_until(driver, lambda: kill_node(ids[victim_id]))
    message = error["message"]
    assert error["code"] == "PoolMemberLost", error
    assert victim_id in message and f"rank {victim_rank}" in message and "lost" in message, message
    try:
        new = wait_for(lambda: serving_again(driver, preview["instanceId"], without=victim_id),
                       timeout_s=READY_DEADLINE_S, interval_s=1.0, what="the model re-placed on the survivors")
    except TimeoutError as exc:
        state = driver.get("/state").json()
        raise AssertionError(f"{exc}\ninstances {state['instances']}\nrunners {state['runners']}\n"
                             f"repairs {state.get('repairFailures')}") from None
    assert victim_id not in {s["nodeId"] for s in new["shards"]}
    assert chat(driver) == expected


def test_a_pool_whose_donor_lends_through_the_managed_rpc_server(spawn_node, tiny_gguf) -> None:
    # The managed build's ggml-rpc-server (what a node exports when one is built: its CPU or
    # GPU) speaks the driver's RPC protocol: the pool serves the same greedy tokens.
    binary = require_native_rpc_server()
    expected = one_node_text(tiny_gguf)
    nodes, preview = start_pool(spawn_node, 2, env={"SKULK_POOL_RPC_SERVER_BIN": str(binary)})
    check_pool(nodes, preview, expected, 2)
    ids = {n.get("/node_id").json()["nodeId"]: n for n in nodes}
    donor = ids[next(s["nodeId"] for s in preview["shards"] if s["rank"] == 1)]
    lent = [p for p in psutil.Process(donor.proc.pid).children(recursive=True) if p.name() == binary.name]
    assert len(lent) == 1, donor.log()[-3000:]
