"""Placement routes show the capacity planner's outputs: `GET /instance/previews` per
feasible placement and `GET /models` per placed instance (plus an abandoned repair)."""

from __future__ import annotations

import itertools

from fastapi.testclient import TestClient

from skulk.api.app import ApiContext, create_app
from skulk.master.placement import PlacementRequest, place
from skulk.models.cards import builtin_cards_dir, resolve_cards
from skulk.shared.types.state import NodeInfo, RepairFailure, State
from skulk.shared.types.telemetry import DiskReading, MemoryReading, NodeResources

CARDS = resolve_cards(builtin_cards_dir(), None).cards
MODEL = "mlx-community/Llama-3.2-1B-Instruct-4bit"
GB = 10**9
RESOURCES = {
    "a": NodeResources(
        node_id="a", node_name="a", version="0",
        memory=MemoryReading(ram_total_bytes=8 * GB, ram_available_bytes=4 * GB),
        disk=DiskReading(models_dir="/m", total_bytes=10**12, free_bytes=10**12), backends=["mlx", "mlx-cpu"],
    )
}
MEMBERS = State(nodes={"a": NodeInfo(node_id="a", node_name="a", version="0")})


def client(state: State) -> TestClient:
    context = ApiContext(node_id="a", node_name="a", get_state=lambda: state, get_cards=lambda: CARDS,
                         get_resources=lambda: RESOURCES)
    return TestClient(create_app(context))


def test_previews_carry_the_planners_outputs():
    body = client(MEMBERS).get(f"/instance/previews?modelId={MODEL}").json()
    (option,) = [p for p in body["previews"] if p["sharding"] == "Pipeline"]
    capacity = option["capacity"]
    assert option["contextTokenLimit"] == capacity["effectiveContextTokens"]
    assert capacity["hotKvTokens"] >= capacity["effectiveContextTokens"] > 8192
    assert (capacity["gpuLayers"], capacity["numLayers"]) == (16, 16)
    assert capacity["shards"][0]["deviceKind"] == "ram"


def test_models_list_placed_instances_with_capacity_and_abandoned_repairs():
    counter = itertools.count()
    instance = place(CARDS[MODEL], MEMBERS, RESOURCES, PlacementRequest(model_id=MODEL),
                     new_id=lambda: f"id{next(counter)}")
    failure = RepairFailure(instance_id="old", node_id="b", repair_hop=2, reason="refused at the last hop")
    state = MEMBERS.model_copy(update={"instances": {instance.instance_id: instance},
                                       "repair_failures": {"local/tiny-llama": failure}})
    models = {m["modelId"]: m for m in client(state).get("/models").json()["models"]}
    (placed,) = models[MODEL]["instances"]
    assert placed["contextTokenLimit"] == instance.context_token_limit
    assert placed["capacity"]["effectiveContextTokens"] == instance.capacity.effective_context_tokens
    assert placed["nodeIds"] == ["a"] and placed["repairHop"] == 0
    assert models["local/tiny-llama"]["repairFailure"]["reason"] == "refused at the last hop"
    assert "instances" not in models["local/tiny-llama"]


def _two_mlx_nodes(network_of: tuple[str, ...]) -> tuple[State, dict]:
    from skulk.shared.types.common import Edge, NetworkInterface

    nodes = ("a", "b")
    small = {n: RESOURCES["a"].model_copy(update={
        "node_id": n, "node_name": n,
        "memory": MemoryReading(ram_total_bytes=2 * GB, ram_available_bytes=int(1.3 * GB)),  # halves fit
    }) for n in nodes}
    state = State(
        nodes={n: NodeInfo(node_id=n, node_name=n, version="0") for n in nodes},
        edges=[Edge(source="a", sink="b", kind="session"), Edge(source="b", sink="a", kind="session")],
        node_network={n: [NetworkInterface(name="eth0", kind="ethernet", addresses=[f"10.0.0.{i}"])]
                      for i, n in enumerate(nodes) if n in network_of},
    )
    return state, small


def _place(state: State, resources: dict):
    submitted = []

    async def submit(command):
        submitted.append(command)

    context = ApiContext(node_id="a", node_name="a", get_state=lambda: state, get_cards=lambda: CARDS,
                         get_resources=lambda: resources, submit_command=submit)
    response = TestClient(create_app(context)).post("/place_instance", json={"modelId": MODEL, "minNodes": 2})
    return response, submitted


def test_a_ring_node_without_its_network_is_a_503_naming_it_and_nothing_is_submitted():
    response, submitted = _place(*_two_mlx_nodes(("a",)))
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "placement_info_pending"
    assert "ring addresses not reported yet" in error["message"] and "'b'" in error["message"]
    assert submitted == []


def test_a_ring_whose_nodes_all_reported_is_placed_with_hosts():
    response, submitted = _place(*_two_mlx_nodes(("a", "b")))
    assert response.status_code == 200, response.text
    assert response.json()["preview"]["ringHosts"] == ["10.0.0.0", "10.0.0.1"]
    assert len(submitted) == 1


def test_a_dry_run_answers_the_placement_and_submits_nothing():
    submitted = []

    async def submit(command):
        submitted.append(command)

    context = ApiContext(node_id="a", node_name="a", get_state=lambda: MEMBERS, get_cards=lambda: CARDS,
                         get_resources=lambda: RESOURCES, submit_command=submit)
    response = TestClient(create_app(context)).post("/place_instance", json={"modelId": MODEL, "dryRun": True})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["dryRun"] is True and body["instanceId"] is None
    assert [s["nodeId"] for s in body["preview"]["shards"]] == ["a"]
    assert submitted == []


def test_idle_ttl_is_carried_by_the_command_and_stamped_by_the_master():
    from skulk.master.commands import DecisionContext, decide

    submitted = []

    async def submit(command):
        submitted.append(command)

    context = ApiContext(node_id="a", node_name="a", get_state=lambda: MEMBERS, get_cards=lambda: CARDS,
                         get_resources=lambda: RESOURCES, submit_command=submit)
    http = TestClient(create_app(context))
    response = http.post("/place_instance", json={"modelId": MODEL, "idleTtl": 300})
    assert response.status_code == 200, response.text
    assert response.json()["preview"]["idleTtlS"] == 300
    [command] = submitted
    assert command.idle_ttl_s == 300
    counter = iter(range(100))
    [created] = decide(MEMBERS, command, DecisionContext(new_id=lambda: f"id-{next(counter)}", origin="a",
                                                         cards=CARDS, resources=RESOURCES))
    assert created.instance.idle_ttl_s == 300
    refused = http.post("/place_instance", json={"modelId": MODEL, "idleTtl": 0})
    assert refused.status_code == 422 or refused.status_code == 400


def test_previews_offer_a_slot_count_only_where_an_engine_with_slots_runs():
    gguf = "local/tiny-llama-gguf"
    served = {"a": RESOURCES["a"].model_copy(update={"backends": ["llama_cpp-cpu", "llama_server-cpu"]})}
    context = ApiContext(node_id="a", node_name="a", get_state=lambda: MEMBERS, get_cards=lambda: CARDS,
                         get_resources=lambda: served)
    body = TestClient(create_app(context)).get(f"/instance/previews?modelId={gguf}").json()
    assert body["slotChoices"] == [{"engine": "llama_server", "min": 1, "max": 64, "default": 4}]
    # An MLX model, and a GGUF one on a node without llama-server, take no slot count.
    assert client(MEMBERS).get(f"/instance/previews?modelId={MODEL}").json()["slotChoices"] == []
    in_process = {"a": RESOURCES["a"].model_copy(update={"backends": ["llama_cpp-cpu"]})}
    context = ApiContext(node_id="a", node_name="a", get_state=lambda: MEMBERS, get_cards=lambda: CARDS,
                         get_resources=lambda: in_process)
    assert TestClient(create_app(context)).get(f"/instance/previews?modelId={gguf}").json()["slotChoices"] == []
