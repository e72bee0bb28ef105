import itertools

import pytest

from skulk.capacity.instance import plan_instance
from skulk.capacity.planner import DeviceSnapshot
from skulk.master.placement import (
    ExclusionsRemovedAll,
    MemoryShortfall,
    ModelUnknown,
    NoCompatibleBackend,
    PlacementError,
    PlacementInfoPending,
    PlacementRequest,
    ShardingUnsupported,
    TopologyGap,
    allocate_layers,
    place,
    preview,
)
from skulk.models.cards import builtin_cards_dir, resolve_cards
from skulk.shared.memory_estimate import (
    NodeMemoryTotals,
    admission_context_tokens,
    instance_context_token_limit,
    shard_footprint_bytes,
)
from skulk.shared.types.commands import PlaceInstance
from skulk.shared.types.common import Edge
from skulk.shared.types.ids import ModelId, NodeId
from skulk.shared.types.state import NodeInfo, State
from skulk.shared.types.telemetry import DiskReading, MemoryReading, NodeResources

CARDS = resolve_cards(builtin_cards_dir(), None).cards
LLAMA_1B = CARDS["mlx-community/Llama-3.2-1B-Instruct-4bit"]  # 16 layers, ~1.60 GB footprint whole
LLAMA_8B = CARDS["mlx-community/Meta-Llama-3.1-8B-Instruct-4bit"]  # 32 layers
GEMMA3 = CARDS["mlx-community/gemma-3-4b-it-4bit"]  # supports_tensor = false; no MLX layer adapter (one rank)
NO_TENSOR = LLAMA_1B.model_copy(update={"placement": LLAMA_1B.placement.model_copy(update={"supports_tensor": False})})
TINY = CARDS["local/tiny-llama"]  # 4 heads, 2 KV heads
GGUF_8B = CARDS["bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"]
GB = 10**9
MLX_CPU = ("mlx", "mlx-cpu")
MLX_METAL = ("mlx", "mlx-metal")
LLAMA_CPU = ("llama_cpp", "llama_cpp-cpu")
GGUF_SERVED_ONLY = GGUF_8B.model_copy(update={"placement": GGUF_8B.placement.model_copy(
    update={"compatible_backends": ["llama_server", "llama_server-cpu"], "backend_preference": []})})


def res(node, available, backends=MLX_CPU, total=None):
    return NodeResources(
        node_id=node,
        node_name=node,
        version="0",
        memory=MemoryReading(ram_total_bytes=total or available * 2, ram_available_bytes=available),
        disk=DiskReading(models_dir="/models", total_bytes=10**12, free_bytes=10**12),
        backends=list(backends),
    )


def cluster(nodes, links=(), phantoms=()):
    """Members `nodes`; `links` as 'a-b' (session edges, one direction is enough)."""
    edges = [Edge(source=link.split("-")[0], sink=link.split("-")[1], kind="session") for link in links]
    return State(nodes={n: NodeInfo(node_id=n, node_name=n, version="0") for n in nodes}, edges=edges)


def ids():
    counter = itertools.count()
    return lambda: f"id{next(counter)}"


def request(card, **kwargs):
    return PlacementRequest(model_id=card.model_id, **kwargs)


def layers(instance):
    return [(s.node_id, s.start_layer, s.end_layer) for s in instance.shards]


def whole(card):
    return shard_footprint_bytes(card, range(card.num_layers), admission_context_tokens(card))


# -- successes -----------------------------------------------------------------------------


def test_single_node_fit():
    instance = place(LLAMA_1B, cluster("a"), {"a": res("a", 4 * GB)}, request(LLAMA_1B), new_id=ids())
    assert instance.instance_id == "id0"
    assert [s.runner_id for s in instance.shards] == ["id1"]
    assert layers(instance) == [("a", 0, 16)]
    assert instance.shards[0].backend == "mlx-cpu" and instance.shards[0].world_size == 1
    assert instance.sharding == "Pipeline" and instance.excluded_nodes == []
    # The stamped window is the capacity planner's on the admitted 4 GB, within the static
    # bound of 8 GB total RAM.
    capacity = plan_instance(LLAMA_1B, instance.shards, {"a": DeviceSnapshot("ram", 8 * GB, 4 * GB)})
    assert instance.capacity == capacity
    assert instance.context_token_limit == capacity.effective_context_tokens
    assert admission_context_tokens(LLAMA_1B) < capacity.effective_context_tokens < instance_context_token_limit(
        LLAMA_1B, instance.shards, {"a": NodeMemoryTotals(8 * GB)}
    )


@pytest.mark.parametrize(
    ("name", "available", "expected"),
    [
        # 4 GB free: the planner's window (live memory) binds below the card's 131072.
        ("planner binds", 4 * GB, "planner"),
        # 2.2 GB free: admitted (footprint ~1.6 GB) but the planner's reserve and headroom
        # leave less than the admission floor of KV: the floor placement reserved still holds.
        ("never below the admission floor", int(2.2 * GB), 8192),
        # 400 GB free on 800 GB: everything fits, the card's context caps it.
        ("capped at the card's context", 400 * GB, LLAMA_1B.context_length),
    ],
)
def test_stamped_context_comes_from_the_capacity_planner(name, available, expected):
    instance = place(LLAMA_1B, cluster("a"), {"a": res("a", available)}, request(LLAMA_1B), new_id=ids())
    if expected == "planner":
        expected = instance.capacity.effective_context_tokens
        assert 8192 < expected < LLAMA_1B.context_length
    assert instance.context_token_limit == expected


def test_preview_shows_the_planners_outputs():
    (option,) = preview(LLAMA_1B, cluster("a"), {"a": res("a", 4 * GB)}, sharding="Pipeline")
    wire = option.to_wire()
    assert wire["capacity"]["effectiveContextTokens"] == option.context_token_limit
    assert wire["capacity"]["hotKvTokens"] >= wire["capacity"]["effectiveContextTokens"]
    assert wire["capacity"]["gpuLayers"] == LLAMA_1B.num_layers
    assert [s["nodeId"] for s in wire["capacity"]["shards"]] == ["a"]


@pytest.mark.parametrize(
    ("name", "resources", "chosen"),
    [
        ("most headroom wins among equals", {"a": res("a", 3 * GB), "b": res("b", 5 * GB)}, "b"),
        (
            "backend preference beats headroom",
            {"a": res("a", 3 * GB, MLX_METAL), "b": res("b", 5 * GB, MLX_CPU)},
            "a",
        ),
        ("node id breaks a tie", {"b": res("b", 3 * GB), "a": res("a", 3 * GB)}, "a"),
        ("fewest nodes first: a fit on one node is never split", {"a": res("a", 2 * GB), "b": res("b", 100 * GB)}, "b"),
    ],
)
def test_single_node_choice(name, resources, chosen):
    instance = place(LLAMA_1B, cluster("ab", ["a-b"]), resources, request(LLAMA_1B), new_id=ids())
    assert instance.node_ids() == [chosen]


def test_backend_is_the_cards_first_preference_the_node_advertises():
    resources = {"a": res("a", 4 * GB, ("mlx", "mlx-cpu", "mlx-metal"))}
    instance = place(LLAMA_1B, cluster("a"), resources, request(LLAMA_1B), new_id=ids())
    assert instance.shards[0].backend == "mlx-metal"


def test_too_big_for_one_node_splits_proportionally():
    resources = {"a": res("a", 3 * GB), "b": res("b", 5 * GB)}
    instance = place(LLAMA_8B, cluster("ab", ["b-a"]), resources, request(LLAMA_8B), new_id=ids())
    assert layers(instance) == [("a", 0, 12), ("b", 12, 32)]  # 32 x 3/8 = 12, 32 x 5/8 = 20
    assert [s.rank for s in instance.shards] == [0, 1]
    assert all(s.world_size == 2 for s in instance.shards)
    assert [s.runner_id for s in instance.shards] == ["id1", "id2"]


def test_memory_credits_count_as_available():
    resources = {"a": res("a", GB, total=8 * GB)}
    with pytest.raises(MemoryShortfall):
        place(LLAMA_1B, cluster("a"), resources, request(LLAMA_1B), new_id=ids())
    instance = place(LLAMA_1B, cluster("a"), resources, request(LLAMA_1B), new_id=ids(), memory_credits={"a": GB})
    assert instance.node_ids() == ["a"]


@pytest.mark.parametrize(("spare", "fits"), [(-1, False), (0, False), (1, True)])
def test_exact_fit_is_refused(spare, fits):
    resources = {"a": res("a", whole(LLAMA_1B) + spare)}
    if fits:
        assert place(LLAMA_1B, cluster("a"), resources, request(LLAMA_1B), new_id=ids()).node_ids() == ["a"]
        return
    with pytest.raises(MemoryShortfall) as caught:
        place(LLAMA_1B, cluster("a"), resources, request(LLAMA_1B), new_id=ids())
    (short,) = caught.value.shortfalls
    assert short.needed_bytes == whole(LLAMA_1B) and short.available_bytes == whole(LLAMA_1B) + spare


@pytest.mark.parametrize(
    ("excluded", "chosen", "stamped"),
    [
        (frozenset({"b"}), ["c"], ["b"]),
        (frozenset({"c", "b"}), ["a"], ["b", "c"]),
        (frozenset({"zz-not-a-member", "b"}), ["c"], ["b", "zz-not-a-member"]),
    ],
)
def test_exclusions_are_honoured_and_stamped_sorted(excluded, chosen, stamped):
    resources = {"a": res("a", 2 * GB), "b": res("b", 8 * GB), "c": res("c", 4 * GB)}
    instance = place(
        LLAMA_1B, cluster("abc", ["a-b", "b-c"]), resources, request(LLAMA_1B, excluded_nodes=excluded), new_id=ids()
    )
    assert instance.node_ids() == chosen
    assert instance.excluded_nodes == stamped


def test_pipeline_boundary_never_beyond_max_split_layer():
    card = LLAMA_1B.model_copy(
        update={"placement": LLAMA_1B.placement.model_copy(update={"max_pipeline_split_layer": 4})}
    )
    resources = {"a": res("a", 3 * GB), "b": res("b", 3 * GB)}
    instance = place(card, cluster("ab", ["a-b"]), resources, request(card, min_nodes=2), new_id=ids())
    assert layers(instance) == [("a", 0, 4), ("b", 4, 16)]  # proportional would be 8 / 8


def test_tensor_splits_weights_evenly_across_every_layer():
    resources = {"a": res("a", 3 * GB), "b": res("b", 3 * GB)}
    instance = place(
        LLAMA_1B, cluster("ab", ["a-b"]), resources, request(LLAMA_1B, sharding="Tensor", min_nodes=2), new_id=ids()
    )
    assert instance.sharding == "Tensor"
    assert layers(instance) == [("a", 0, 16), ("b", 0, 16)]


def test_tensor_skips_world_sizes_that_do_not_divide_the_heads():
    nodes = "abcd"
    resources = {n: res(n, 3 * GB) for n in nodes}
    state = cluster(nodes, ["a-b", "b-c", "c-d"])
    instance = place(LLAMA_1B, state, resources, request(LLAMA_1B, sharding="Tensor", min_nodes=3), new_id=ids())
    assert instance.node_ids() == ["a", "b", "c", "d"]  # 3 does not divide 8 KV heads; 4 does


def test_chain_order_follows_the_edges():
    resources = {n: res(n, int(1.2 * GB)) for n in "abc"}
    state = cluster("abc", ["a-c", "c-b"])  # a and b are not neighbours: order a, c, b
    instance = place(LLAMA_1B, state, resources, request(LLAMA_1B, min_nodes=3), new_id=ids())
    assert instance.node_ids() == ["a", "c", "b"]


def test_place_instance_command_becomes_a_request():
    command = PlaceInstance(command_id="c1", model_id=LLAMA_1B.model_id, min_nodes=2, excluded_nodes=["x"])
    assert PlacementRequest.from_command(command) == PlacementRequest(
        model_id=LLAMA_1B.model_id, sharding="Pipeline", min_nodes=2, excluded_nodes=frozenset({"x"})
    )


def test_gguf_context_keeps_the_floor_without_discrete_vram():
    resources = {"a": res("a", 64 * GB, LLAMA_CPU)}
    instance = place(GGUF_8B, cluster("a"), resources, request(GGUF_8B), new_id=ids())
    assert instance.shards[0].backend == "llama_cpp-cpu"
    assert instance.context_token_limit == 8192


def test_missing_resources_do_not_block_a_placement_that_fits_elsewhere():
    instance = place(LLAMA_1B, cluster("ab", ["a-b"]), {"a": res("a", 4 * GB)}, request(LLAMA_1B), new_id=ids())
    assert instance.node_ids() == ["a"]


# -- failures --------------------------------------------------------------------------------


def test_a_family_without_a_layer_adapter_is_placed_on_one_node():
    instance = place(GEMMA3, cluster("ab", ["a-b"]), {n: res(n, 64 * GB) for n in "ab"}, request(GEMMA3),
                     new_id=ids())
    assert len(instance.shards) == 1 and instance.shards[0].backend.startswith("mlx")


def _fails(card, state, resources, req):
    with pytest.raises(PlacementError) as caught:
        place(card, state, resources, req, new_id=ids())
    return caught.value


@pytest.mark.parametrize(
    ("name", "card", "state", "resources", "req", "error", "status"),
    [
        ("unknown model", None, cluster("a"), {"a": res("a", 4 * GB)}, request(LLAMA_1B), ModelUnknown, 400),
        ("no members yet", LLAMA_1B, cluster(""), {}, request(LLAMA_1B), PlacementInfoPending, 503),
        (
            "exclusions remove everything",
            LLAMA_1B,
            cluster("ab", ["a-b"]),
            {"a": res("a", 4 * GB), "b": res("b", 4 * GB)},
            request(LLAMA_1B, excluded_nodes=frozenset("ab")),
            ExclusionsRemovedAll,
            400,
        ),
        ("no resources gossiped yet", LLAMA_1B, cluster("ab", ["a-b"]), {}, request(LLAMA_1B), PlacementInfoPending, 503),
        (
            "resources lagging: the reporting node is too small",
            LLAMA_1B,
            cluster("ab", ["a-b"]),
            {"a": res("a", GB)},
            request(LLAMA_1B),
            PlacementInfoPending,
            503,
        ),
        (
            "an MLX card on llama_cpp-only nodes",
            LLAMA_1B,
            cluster("ab", ["a-b"]),
            {"a": res("a", 4 * GB, LLAMA_CPU), "b": res("b", 4 * GB, ("llama_cpp", "llama_cpp-cuda"))},
            request(LLAMA_1B),
            NoCompatibleBackend,
            400,
        ),
        (
            "islands: no connected pair can hold the model",
            LLAMA_1B,
            cluster("abcd", ["a-b", "c-d"]),
            {n: res(n, int(1.2 * GB)) for n in "abcd"},
            request(LLAMA_1B, min_nodes=3),
            TopologyGap,
            400,
        ),
        (
            "edges to phantom nodes only",
            LLAMA_8B,
            cluster("ab", ["a-x", "y-b"]),
            {"a": res("a", 3 * GB), "b": res("b", 5 * GB)},
            request(LLAMA_8B),
            TopologyGap,
            400,
        ),
        (
            "edges lagging members",
            LLAMA_8B,
            cluster("ab"),
            {"a": res("a", 3 * GB), "b": res("b", 5 * GB)},
            request(LLAMA_8B),
            PlacementInfoPending,
            503,
        ),
        (
            "fewer compatible nodes than min_nodes",
            LLAMA_1B,
            cluster("ab", ["a-b"]),
            {"a": res("a", 4 * GB), "b": res("b", 4 * GB, LLAMA_CPU)},
            request(LLAMA_1B, min_nodes=2),
            TopologyGap,
            400,
        ),
        (
            "tensor on a card that does not support it",
            NO_TENSOR,
            cluster("a"),
            {"a": res("a", 64 * GB)},
            request(NO_TENSOR, sharding="Tensor"),
            ShardingUnsupported,
            400,
        ),
        (
            "tensor world size that divides no heads",
            TINY,
            cluster("abc", ["a-b", "b-c"]),
            {n: res(n, 4 * GB) for n in "abc"},
            request(TINY, sharding="Tensor", min_nodes=3),
            ShardingUnsupported,
            400,
        ),
        (
            "more pipeline ranks than layers",
            TINY,
            cluster("a"),
            {"a": res("a", 4 * GB)},
            request(TINY, min_nodes=7),
            ShardingUnsupported,
            400,
        ),
        (
            "a single-node engine asked for two nodes",
            GGUF_SERVED_ONLY,
            cluster("ab", ["a-b"]),
            {n: res(n, 64 * GB, ("llama_server", "llama_server-cpu")) for n in "ab"},
            request(GGUF_SERVED_ONLY, min_nodes=2),
            ShardingUnsupported,
            400,
        ),
        (
            "a llama.cpp pool asked for tensor sharding",
            GGUF_8B,
            cluster("ab", ["a-b"]),
            {n: res(n, 64 * GB, LLAMA_CPU) for n in "ab"},
            request(GGUF_8B, min_nodes=2, sharding="Tensor"),
            ShardingUnsupported,
            400,
        ),
        (
            "a family without a sharding layout is never spread over nodes (never a failure at load)",
            GEMMA3,
            cluster("ab", ["a-b"]),
            {n: res(n, 64 * GB) for n in "ab"},
            request(GEMMA3, min_nodes=2),
            ShardingUnsupported,
            400,
        ),
        (
            "a GGUF model too big even for the whole pool",
            GGUF_8B,
            cluster("ab", ["a-b"]),
            {n: res(n, 2 * GB, LLAMA_CPU) for n in "ab"},
            request(GGUF_8B),
            MemoryShortfall,
            400,
        ),
    ],
)
def test_placement_errors(name, card, state, resources, req, error, status):
    failure = _fails(card, state, resources, req)
    assert type(failure) is error
    assert failure.http_status == status
    assert failure.code and failure.message


def test_no_compatible_backend_names_nodes_and_backends():
    resources = {"a": res("a", 4 * GB, LLAMA_CPU)}
    failure = _fails(LLAMA_1B, cluster("a"), resources, request(LLAMA_1B))
    assert isinstance(failure, NoCompatibleBackend)
    assert failure.node_backends == {"a": LLAMA_CPU}
    assert failure.card_backends == ("mlx", "mlx-metal", "mlx-cpu")
    assert "a: ['llama_cpp', 'llama_cpp-cpu']" in failure.message


def test_memory_shortfall_shows_the_arithmetic():
    failure = _fails(LLAMA_1B, cluster("a"), {"a": res("a", GB)}, request(LLAMA_1B))
    assert isinstance(failure, MemoryShortfall)
    (short,) = failure.shortfalls
    assert (short.node_id, short.available_bytes) == ("a", GB)
    assert short.needed_bytes == whole(LLAMA_1B)
    expected = "weights 0.69 GB x 1.15 + KV 0.27 GB (8192 tokens) + floor 0.54 GB = 1.60 GB > 1.00 GB available"
    assert short.arithmetic == expected
    assert expected in failure.message


def test_exact_fit_message_says_why():
    failure = _fails(LLAMA_1B, cluster("a"), {"a": res("a", whole(LLAMA_1B))}, request(LLAMA_1B))
    assert "= 1.60 GB >= 1.60 GB available (an exact fit thrashes)" in failure.message


def test_topology_gap_names_the_set_and_edges():
    failure = _fails(
        LLAMA_1B, cluster("abcd", ["a-b", "c-d"]), {n: res(n, int(1.2 * GB)) for n in "abcd"}, request(LLAMA_1B, min_nodes=3)
    )
    assert isinstance(failure, TopologyGap)
    assert failure.needed_nodes == 3
    assert "a-b, c-d" in failure.message


def test_pending_names_the_nodes_it_waits_for():
    failure = _fails(LLAMA_1B, cluster("abc", ["a-b", "b-c"]), {"a": res("a", GB)}, request(LLAMA_1B))
    assert isinstance(failure, PlacementInfoPending)
    assert failure.nodes == ("b", "c") and failure.retryable


# -- layer allocation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_layers", "weights", "limit", "expected"),
    [
        (32, [3, 5], None, [12, 20]),
        (16, [1, 1, 1], None, [6, 5, 5]),  # largest remainder, ties to the lower rank
        (10, [1, 1000], None, [1, 9]),  # at least one layer each
        (16, [1, 1], 4, [4, 12]),  # boundary moved left to the split limit
        (16, [1, 1, 1], 4, [2, 2, 12]),  # the front ranks share the layers before the limit
        (16, [3, 1, 4], 5, [4, 1, 11]),
        (4, [1] * 5, None, None),  # more ranks than layers
        (16, [1, 1, 1], 1, None),  # two boundaries cannot both sit at or before layer 1
        (6, [0, 0], None, [3, 3]),  # no memory reading: split evenly
    ],
)
def test_allocate_layers(num_layers, weights, limit, expected):
    counts = allocate_layers(num_layers, weights, limit)
    assert counts == expected
    if counts is not None:
        assert sum(counts) == num_layers and min(counts) >= 1


# -- preview ---------------------------------------------------------------------------------


def test_preview_lists_feasible_placements_best_first():
    resources = {"a": res("a", 2 * GB), "b": res("b", 3 * GB)}
    options = preview(LLAMA_1B, cluster("ab", ["a-b"]), resources)
    assert [(o.sharding, o.node_ids) for o in options[:2]] == [("Pipeline", ["b"]), ("Pipeline", ["a"])]
    assert {(o.sharding, tuple(o.node_ids)) for o in options} >= {("Tensor", ("a", "b")), ("Pipeline", ("a", "b"))}
    for option in options:
        assert all(s.needed_bytes < s.available_bytes for s in option.shards)
        assert option.context_token_limit >= 8192
    two = next(o for o in options if o.sharding == "Pipeline" and len(o.node_ids) == 2)
    assert [(s.start_layer, s.end_layer) for s in two.shards] == [(0, 6), (6, 16)]
    assert [s.available_bytes for s in two.shards] == [2 * GB, 3 * GB]
    assert options[0].to_wire()["nodeIds"] == ["b"]


@pytest.mark.parametrize(("sharding", "expected"), [("Pipeline", {"Pipeline"}), ("Tensor", set())])
def test_preview_filters_by_sharding(sharding, expected):
    options = preview(NO_TENSOR, cluster("a"), {"a": res("a", 64 * GB)}, sharding=sharding)
    assert {o.sharding for o in options} == expected


def test_preview_is_empty_when_nothing_fits():
    assert preview(LLAMA_1B, cluster("a"), {"a": res("a", GB)}) == []


# -- determinism -------------------------------------------------------------------------------


def test_same_inputs_same_instance():
    state = cluster("abc", ["a-b", "b-c"])
    forward = {n: res(n, int(1.2 * GB)) for n in "abc"}
    backward = {n: forward[n] for n in "cba"}
    first = place(LLAMA_1B, state, forward, request(LLAMA_1B, min_nodes=2), new_id=ids())
    second = place(LLAMA_1B, state, backward, request(LLAMA_1B, min_nodes=2), new_id=ids())
    assert first == second
    assert first.instance_id == "id0" and first.runner_ids() == ["id1", "id2"]


def test_a_family_the_engine_loads_but_cannot_shard_stays_on_one_node(monkeypatch):
    """The traits table can say an engine loads a family it has no sharding layout for:
    then two nodes are refused (typed) and one node is used."""
    from dataclasses import replace
    from types import MappingProxyType

    import skulk.shared.types.engines as engines

    table = dict(engines.ENGINE_TRAITS)
    table["mlx"] = replace(table["mlx"], sharded_families=frozenset({"mistral"}))
    monkeypatch.setattr(engines, "ENGINE_TRAITS", MappingProxyType(table))
    two = _fails(TINY, cluster("ab", ["a-b"]), {n: res(n, 4 * GB) for n in "ab"}, request(TINY, min_nodes=2))
    assert isinstance(two, ShardingUnsupported) and "'llama' serves on one node here: mlx shards only mistral" in two.message
    big = LLAMA_1B  # ~1.6 GB whole: two 1.2 GB nodes could hold it split, but llama may not be split now
    short = _fails(big, cluster("ab", ["a-b"]), {n: res(n, int(1.2 * GB)) for n in "ab"}, request(big))
    assert isinstance(short, MemoryShortfall)


@pytest.mark.parametrize(
    ("name", "resources", "node", "backend"),
    [
        ("a node with llama-server serves with it", {"a": res("a", 40 * GB, ("llama_cpp", "llama_cpp-cpu", "llama_server", "llama_server-cpu"))}, "a", "llama_server-cpu"),
        ("without it, in-process llama.cpp", {"a": res("a", 40 * GB, LLAMA_CPU)}, "a", "llama_cpp-cpu"),
        (
            "the served engine ranks like its in-process twin: a GPU lane still wins",
            {"a": res("a", 40 * GB, ("llama_cpp", "llama_cpp-cuda", "llama_server", "llama_server-cpu")),
             "b": res("b", 40 * GB, ("llama_server", "llama_server-cpu"))},
            "a", "llama_cpp-cuda",
        ),
        (
            "served on the same compute beats in-process across nodes",
            {"a": res("a", 40 * GB, LLAMA_CPU), "b": res("b", 30 * GB, ("llama_server", "llama_server-cpu"))},
            "b", "llama_server-cpu",
        ),
    ],
)
def test_gguf_placement_prefers_the_served_engine(name, resources, node, backend):
    instance = place(GGUF_8B, cluster(resources, ["a-b"] if len(resources) > 1 else []), resources, request(GGUF_8B), new_id=ids())
    assert (instance.node_ids(), instance.shards[0].backend) == ([node], backend), name


# -- served-engine slots: KV for every slot ----------------------------------------------------

SERVED_CPU = ("llama_cpp", "llama_cpp-cpu", "llama_server", "llama_server-cpu")


def served_res(node, available, slots=None, backends=SERVED_CPU):
    reading = res(node, available, backends, total=available * 4)
    return reading.model_copy(update={"engine_slots": {} if slots is None else {"llama_server": slots}})


def gguf_whole(slots):
    return shard_footprint_bytes(GGUF_8B, range(GGUF_8B.num_layers), admission_context_tokens(GGUF_8B), slots)


@pytest.mark.parametrize(
    ("name", "reading", "backend", "slots", "wanted"),
    [
        ("the node's setting is granted when KV for every slot fits",
         served_res("a", gguf_whole(8) + GB, slots=8), "llama_server-cpu", 8, None),
        ("a node that advertises none gets the default 4",
         served_res("a", gguf_whole(4) + GB), "llama_server-cpu", 4, None),
        ("too little for 4 slots: reduced to the 2 that fit, saying so",
         served_res("a", gguf_whole(2) + 1, slots=4), "llama_server-cpu", 2, 4),
        ("an exact fit thrashes: one fewer slot",
         served_res("a", gguf_whole(3), slots=4), "llama_server-cpu", 2, 4),
        ("the in-process engine decodes one at a time",
         served_res("a", gguf_whole(1) + GB, slots=8, backends=LLAMA_CPU), "llama_cpp-cpu", 1, None),
    ],
)
def test_placement_stamps_the_slots_whose_kv_fits(name, reading, backend, slots, wanted):
    instance = place(GGUF_8B, cluster("a"), {"a": reading}, request(GGUF_8B), new_id=ids())
    (shard,) = instance.shards
    assert (shard.backend, shard.slots, shard.slots_wanted) == (backend, slots, wanted), name
    (option,) = preview(GGUF_8B, cluster("a"), {"a": reading}, sharding="Pipeline")
    (shown,) = option.shards
    assert (shown.slots, shown.slots_wanted) == (slots, wanted)
    assert shown.needed_bytes == gguf_whole(slots if backend.startswith("llama_server") else 1)


def test_not_even_one_slot_fits_is_a_shortfall_naming_context_slots_and_memory():
    reading = served_res("a", gguf_whole(1) - 1, slots=4, backends=("llama_server", "llama_server-cpu"))
    with pytest.raises(MemoryShortfall) as caught:
        place(GGUF_8B, cluster("a"), {"a": reading}, request(GGUF_8B), new_id=ids())
    message = str(caught.value)
    tokens = admission_context_tokens(GGUF_8B)
    assert f"even 1 of the node's 4 llama_server slots, {tokens} tokens of context each, does not fit" in message
    assert "GB available" in message


def test_the_stamped_slots_are_what_the_worker_guard_and_the_credit_count():
    from skulk.shared.memory_estimate import assignment_footprint, instance_node_footprints

    reading = served_res("a", gguf_whole(8) + GB, slots=8)
    instance = place(GGUF_8B, cluster("a"), {"a": reading}, request(GGUF_8B), new_id=ids())
    footprint = assignment_footprint(GGUF_8B, instance.shards[0])
    assert footprint.kv_copies == 8 and footprint.total_bytes == gguf_whole(8)
    assert "x 8 slots" in footprint.describe()
    assert instance_node_footprints(GGUF_8B, instance) == {"a": gguf_whole(8)}


# -- speech ----------------------------------------------------------------------------------

WHISPER_SMALL = CARDS["Systran/faster-whisper-small"]
TINY_WHISPER = CARDS["local/tiny-whisper"]
WHISPER_CPU = ("faster_whisper", "faster_whisper-cpu")


@pytest.mark.parametrize("card", [TINY_WHISPER, WHISPER_SMALL])
def test_a_speech_model_is_placed_whole_on_one_node_with_its_engine(card):
    resources = {"a": res("a", 64 * GB, backends=MLX_CPU), "b": res("b", 2 * GB, backends=WHISPER_CPU)}
    instance = place(card, cluster("ab", ["a-b"]), resources, request(card), new_id=ids())
    assert layers(instance) == [("b", 0, card.num_layers)]
    assert instance.shards[0].backend == "faster_whisper-cpu"
    options = preview(card, cluster("ab", ["a-b"]), resources)
    assert options and all(o.node_ids == ["b"] for o in options)


MLX_WHISPER_CARDS = [CARDS[ModelId("local/tiny-mlx-whisper")], CARDS[ModelId("mlx-community/whisper-small-mlx")]]


@pytest.mark.parametrize("card", MLX_WHISPER_CARDS)
def test_an_mlx_whisper_model_lands_only_where_mlx_whisper_is_advertised(card):
    # a: MLX text and faster-whisper (no mlx-whisper), roomy; b: a Mac with mlx-whisper on Metal.
    resources = {NodeId("a"): res("a", 64 * GB, backends=(*MLX_CPU, *WHISPER_CPU)),
                 NodeId("b"): res("b", 4 * GB, backends=("mlx", "mlx-metal", "mlx_whisper", "mlx_whisper-metal"))}
    instance = place(card, cluster("ab", ["a-b"]), resources, request(card), new_id=ids())
    assert layers(instance) == [("b", 0, card.num_layers)]
    assert instance.shards[0].backend == "mlx_whisper-metal", "Metal first, as the card ranks it"
    options = preview(card, cluster("ab", ["a-b"]), resources)
    assert options and all(o.node_ids == ["b"] for o in options)
    # Without a node advertising mlx_whisper it is refused, never handed to faster-whisper.
    only_a = {NodeId("a"): resources[NodeId("a")]}
    assert preview(card, cluster("a"), only_a) == []
    with pytest.raises(PlacementError):
        place(card, cluster("a"), only_a, request(card), new_id=ids())


def test_a_speech_model_never_spans_nodes():
    # Two nodes that could share its weights, neither able to hold it alone: refused, not split.
    half = whole(WHISPER_SMALL) * 3 // 4
    resources = {n: res(n, half, backends=WHISPER_CPU) for n in "ab"}
    assert preview(WHISPER_SMALL, cluster("ab", ["a-b"]), resources) == []
    with pytest.raises(PlacementError):
        place(WHISPER_SMALL, cluster("ab", ["a-b"]), resources, request(WHISPER_SMALL), new_id=ids())


def test_a_vision_mlx_model_is_placed_whole_on_one_node():
    vlm = CARDS["local/tiny-vlm"]  # on MLX's vision path (mlx-vlm): one rank
    instance = place(vlm, cluster("ab", ["a-b"]), {n: res(n, 64 * GB) for n in "ab"}, request(vlm), new_id=ids())
    assert len(instance.shards) == 1 and instance.shards[0].backend.startswith("mlx")
    refused = _fails(vlm, cluster("ab", ["a-b"]), {n: res(n, 64 * GB) for n in "ab"}, request(vlm, min_nodes=2))
    assert isinstance(refused, ShardingUnsupported)


PROJECTOR_BYTES = 800_000_000  # Gemma 3 4B's mmproj at f16
VLM_8B = GGUF_8B.model_validate({**GGUF_8B.model_dump(), "capabilities": [*GGUF_8B.capabilities, "vision"],
                                 "vision_weights_repo": GGUF_8B.model_id, "vision_weights_file": "mmproj-f16.gguf",
                                 "vision_weights_size_bytes": PROJECTOR_BYTES})


def test_a_vision_model_that_fits_only_without_its_projector_is_refused_naming_it():
    available = whole(GGUF_8B) + PROJECTOR_BYTES // 2  # the model fits; the model and its projector do not
    resources = {"a": res("a", available, LLAMA_CPU)}
    place(GGUF_8B, cluster("a"), resources, request(GGUF_8B), new_id=ids())
    failure = _fails(VLM_8B, cluster("a"), resources, request(VLM_8B))
    assert isinstance(failure, MemoryShortfall)
    (short,) = failure.shortfalls
    assert short.needed_bytes == whole(GGUF_8B) + PROJECTOR_BYTES == whole(VLM_8B)
    assert "+ projector 0.80 GB" in short.arithmetic and "+ projector 0.80 GB" in failure.message


def test_a_vision_models_projector_is_admitted_on_rank_0_and_shown_in_the_preview():
    resources = {"a": res("a", whole(GGUF_8B) + 2 * PROJECTOR_BYTES, LLAMA_CPU)}
    (only, *_) = preview(VLM_8B, cluster("a"), resources)
    (shard,) = only.shards
    assert (shard.projector_bytes, shard.needed_bytes) == (PROJECTOR_BYTES, whole(VLM_8B))
    assert "+ projector 0.80 GB" in shard.breakdown
    # Over two stages only the first loads it.
    two = {n: res(n, whole(GGUF_8B) * 7 // 10, LLAMA_CPU) for n in "ab"}
    instance = place(VLM_8B, cluster("ab", ["a-b"]), two, request(VLM_8B, min_nodes=2), new_id=ids())
    (first, second) = preview(VLM_8B, cluster("ab", ["a-b"]), two, sharding="Pipeline")[0].shards
    assert (first.rank, first.start_layer, first.projector_bytes, second.projector_bytes) == (0, 0, PROJECTOR_BYTES, 0)
    assert [s.rank for s in instance.shards] == [0, 1]
