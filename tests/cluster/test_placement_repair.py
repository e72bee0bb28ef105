"""Self-healing placements with real node processes.

The worker's pre-spawn memory guard is made to see almost no free memory through the
test-only knob `SKULK_TEST_WORKER_RAM_AVAILABLE_BYTES` (worker/main.py), while telemetry,
which the master admits on, still reports the real figure: the master places, the worker
refuses, and the master repairs. Nothing here loads weights unless a repair succeeds.
"""

from __future__ import annotations

import asyncio
import re
import time

import httpx

from skulk.cluster.commander import Commander
from skulk.shared.types.commands import CreateInstance
from skulk.shared.types.ids import new_id
from skulk.shared.types.instances import Instance, ShardAssignment
from tests.cluster.harness import node_id, wait_agreed
from tests.nodeproc import NodeProcess, free_port, wait_for

MLX_MODEL = "local/tiny-llama"
GGUF_MODEL = "local/tiny-llama-gguf"
CLUSTER_KEY = "repair-key"
REFUSE_ALL = {"SKULK_TEST_WORKER_RAM_AVAILABLE_BYTES": "1"}
REPAIR_DEADLINE_S = 60.0
"""A hang guard: the whole chain is three or four control-plane round trips; a loaded
2-core machine starts runners and elects slowly."""


def start(spawn, names_envs: list[tuple[str, dict[str, str]]]) -> list[NodeProcess]:
    """Nodes on loopback ports, each bootstrapping from the first, with per-node env."""
    ports = [free_port() for _ in names_envs]
    first = f"tcp/127.0.0.1:{ports[0]}"
    nodes = []
    for (name, env), port in zip(names_envs, ports, strict=True):
        args = ["--listen", f"tcp/127.0.0.1:{port}", "--cluster-key", CLUSTER_KEY, "--node-name", name]
        if port != ports[0]:
            args += ["--bootstrap-peers", first]
        nodes.append(spawn(name, extra_args=args, env=env))
    for node in nodes:
        node.wait_ready()
    wait_agreed(nodes, members=len(nodes))
    return nodes


def wait_placeable(nodes: list[NodeProcess], model: str, width: int) -> None:
    """Every node's planner sees a feasible `width`-node placement of `model`: resources and
    connection edges have gossiped everywhere (the master re-places from its own view)."""
    def placeable(node: NodeProcess) -> bool:
        previews = node.get(f"/instance/previews?modelId={model}").json()["previews"]
        return any(len(p["nodeIds"]) == width for p in previews)

    wait_for(lambda: all(placeable(n) for n in nodes), timeout_s=REPAIR_DEADLINE_S, interval_s=0.5,
             what=f"a {width}-node placement of {model} on every node")


def place(node: NodeProcess, model: str, **body) -> str:
    def placed():
        response = httpx.post(node.url + "/place_instance", json={"modelId": model, **body}, timeout=10)
        if response.status_code == 503:  # resources or edges still gossiping
            return None
        assert response.status_code == 200, response.text
        return response.json()["instanceId"]

    return wait_for(placed, timeout_s=REPAIR_DEADLINE_S, interval_s=0.5, what=f"placement of {model}")


def repair_failure(node: NodeProcess, model: str) -> dict | None:
    return node.get("/state").json().get("repairFailures", {}).get(model)


def all_logs(nodes: list[NodeProcess]) -> str:
    return "\n".join(n.log() for n in nodes)


def test_refusals_widen_then_fall_back_then_end_with_a_terminal_failure(spawn_node):
    nodes = start(spawn_node, [("alpha", REFUSE_ALL), ("beta", REFUSE_ALL)])
    wait_placeable(nodes, MLX_MODEL, 2)
    place(nodes[0], MLX_MODEL)
    try:
        failure = wait_for(lambda: repair_failure(nodes[0], MLX_MODEL), timeout_s=REPAIR_DEADLINE_S,
                           what="the repair chain to end")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{all_logs(nodes)[-6000:]}") from None
    state = nodes[0].get("/state").json()
    assert not [i for i in state["instances"].values() if i["modelId"] == MLX_MODEL]
    assert failure["repairHop"] == 2 and "giving up" in failure["reason"], failure
    logs = all_logs(nodes)
    hop1 = re.findall(r"re-placed local/tiny-llama as instance \w+ at repair hop 1 on nodes (\S+)", logs)
    hop2 = re.findall(r"re-placed local/tiny-llama as instance \w+ at repair hop 2 on nodes (\S+)", logs)
    assert len(hop1) == 1 and len(hop1[0].split(",")) == 2, logs[-6000:]  # one node wider
    assert len(hop2) == 1 and len(hop2[0].split(",")) == 1  # then a single node
    assert failure["nodeId"] == hop2[0]  # refused by the fallback node: terminal
    # Every node agrees on the outcome (it is replicated State, not a log line).
    wait_for(lambda: all(repair_failure(n, MLX_MODEL) == failure for n in nodes), timeout_s=10, what="agreement")


async def create_on(nodes: list[NodeProcess], instance: Instance) -> None:
    """Submit CreateInstance (an explicit placement) until the instance shows up in State or
    its repair has begun; a command published before the mesh settles may be lost."""
    endpoint = nodes[0].extra_args[nodes[0].extra_args.index("--listen") + 1]
    async with await Commander.connect(CLUSTER_KEY, [endpoint]) as commander:
        deadline = time.monotonic() + REPAIR_DEADLINE_S
        while time.monotonic() < deadline:
            if commander.connected_peers():
                await commander.submit(CreateInstance(command_id=new_id(), instance=instance))
            await asyncio.sleep(1.0)
            if (instance.instance_id in nodes[0].get("/state").json()["instances"]
                    or f"instance {instance.instance_id}" in all_logs(nodes)):
                return
    raise AssertionError(f"instance {instance.instance_id} was never created\n{all_logs(nodes)[-4000:]}")


def place_gguf_on(nodes: list[NodeProcess], target_id: str) -> Instance:
    """Once every node's resources are known everywhere (one single-node preview per node),
    create a one-shard instance of the tiny GGUF on `target_id`, explicitly placed."""
    wait_for(lambda: all(len([p for p in n.get(f"/instance/previews?modelId={GGUF_MODEL}").json()["previews"]
                              if len(p["nodeIds"]) == 1]) == len(nodes)
                         for n in nodes), timeout_s=REPAIR_DEADLINE_S, what="every node placeable")
    instance = Instance(
        instance_id=new_id(), model_id=GGUF_MODEL, sharding="Pipeline", context_token_limit=2048,
        shards=[ShardAssignment(node_id=target_id, runner_id=new_id(), rank=0, world_size=1, start_layer=0,
                                end_layer=6, backend="llama_cpp-cpu")],
    )
    asyncio.run(create_on(nodes, instance))
    return instance


def test_a_refused_gguf_shard_falls_back_to_the_other_node_and_serves(spawn_node):
    refuser, healthy = start(spawn_node, [("refuser", REFUSE_ALL), ("healthy", {})])
    refuser_id, healthy_id = node_id(refuser), node_id(healthy)
    place_gguf_on([refuser, healthy], refuser_id)

    def serving():
        state = healthy.get("/state").json()
        for inst in state["instances"].values():
            runners = [state["runners"].get(s["runnerId"], {}).get("state") for s in inst["shards"]]
            if inst["modelId"] == GGUF_MODEL and all(r in ("Ready", "Running") for r in runners):
                return inst
        return None

    try:
        inst = wait_for(serving, timeout_s=120, interval_s=0.5, what="the re-placed instance serving")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{all_logs([refuser, healthy])[-6000:]}") from None
    # "One node wider" is a llama.cpp pool over both nodes, which the refuser refuses again;
    # then the single-node fallback, which excludes the refuser.
    assert [s["nodeId"] for s in inst["shards"]] == [healthy_id]
    assert inst["repairHop"] == 2 and refuser_id in inst["excludedNodes"]
    assert f"node {refuser_id} refused its shard" in all_logs([refuser, healthy])
    reply = httpx.post(healthy.url + "/v1/chat/completions", timeout=60, json={
        "model": GGUF_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 4
