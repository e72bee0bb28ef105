"""Placement of a GGUF model pooled over llama.cpp's RPC backend: rank 0 drives, the other
ranks lend memory. Table tests over the pure `place` / `preview`."""

from __future__ import annotations

import pytest

from skulk.master.placement import MemoryShortfall, ShardingUnsupported, place, preview
from tests.master.test_placement import GB, GGUF_8B, LLAMA_CPU, _fails, cluster, ids, layers, request, res

SERVED_AND_INPROC = ("llama_server", "llama_server-cpu", "llama_cpp", "llama_cpp-cpu")
SERVED_ONLY = ("llama_server", "llama_server-cpu")
CUDA = ("llama_cpp", "llama_cpp-cuda")


@pytest.mark.parametrize(
    ("name", "resources", "links", "req", "expected_layers", "expected_backends"),
    [
        (
            "fits no single node: pooled automatically, layers in proportion to memory",
            {"a": res("a", 6 * GB, LLAMA_CPU), "b": res("b", 3 * GB, LLAMA_CPU)},
            ["a-b"], {},
            [("a", 0, 21), ("b", 21, 32)], ["llama_cpp-cpu", "llama_cpp-cpu"],
        ),
        (
            "fits one node: a pool only when min_nodes asks",
            {"a": res("a", 64 * GB, LLAMA_CPU), "b": res("b", 64 * GB, LLAMA_CPU)},
            ["a-b"], {"min_nodes": 2},
            [("a", 0, 16), ("b", 16, 32)], ["llama_cpp-cpu", "llama_cpp-cpu"],
        ),
        (
            "three nodes with min_nodes 3",
            {n: res(n, 64 * GB, LLAMA_CPU) for n in "abc"},
            ["a-b", "b-c"], {"min_nodes": 3},
            [("a", 0, 11), ("b", 11, 22), ("c", 22, 32)], ["llama_cpp-cpu"] * 3,
        ),
        (
            "a node that ranks llama-server first still pools through the in-process engine",
            {"a": res("a", 4 * GB, SERVED_AND_INPROC), "b": res("b", 4 * GB, SERVED_AND_INPROC)},
            ["a-b"], {},
            [("a", 0, 16), ("b", 16, 32)], ["llama_cpp-cpu", "llama_cpp-cpu"],
        ),
        (
            "mixed compute: a CUDA driver with a CPU donor is admitted",
            {"a": res("a", 4 * GB, CUDA), "b": res("b", 4 * GB, LLAMA_CPU)},
            ["a-b"], {},
            [("a", 0, 16), ("b", 16, 32)], ["llama_cpp-cuda", "llama_cpp-cpu"],
        ),
        (
            "a served-only node cannot lend memory: the pool uses the others",
            {"a": res("a", 5 * GB, LLAMA_CPU), "b": res("b", 30 * GB, SERVED_ONLY), "c": res("c", 5 * GB, LLAMA_CPU)},
            ["a-b", "b-c", "a-c"], {"min_nodes": 2},
            [("a", 0, 16), ("c", 16, 32)], ["llama_cpp-cpu", "llama_cpp-cpu"],
        ),
    ],
)
def test_pooled_placements(name, resources, links, req, expected_layers, expected_backends):
    instance = place(GGUF_8B, cluster(sorted(resources), links), resources, request(GGUF_8B, **req), new_id=ids())
    assert layers(instance) == expected_layers, name
    # State carries every rank's admitted memory (the capacity plan per rank).
    assert [s.rank for s in instance.capacity.shards] == list(range(len(expected_layers)))
    assert all(s.admitted_bytes > 0 for s in instance.capacity.shards)
    assert [s.backend for s in instance.shards] == expected_backends, name
    assert instance.sharding == "Pipeline"


def test_pool_needs_every_member_to_have_a_spanning_engine():
    resources = {"a": res("a", 5 * GB, LLAMA_CPU), "b": res("b", 30 * GB, SERVED_ONLY)}
    failure = _fails(GGUF_8B, cluster("ab", ["a-b"]), resources, request(GGUF_8B, min_nodes=2))
    # b serves GGUF alone (llama-server) but cannot be a pool member: nothing of size 2 exists.
    assert failure.code in {"topology_gap", "memory_shortfall"}, failure


def test_pool_shortfall_names_each_node_and_its_arithmetic():
    resources = {n: res(n, 2 * GB, LLAMA_CPU) for n in "ab"}
    failure = _fails(GGUF_8B, cluster("ab", ["a-b"]), resources, request(GGUF_8B))
    assert isinstance(failure, MemoryShortfall)
    assert set(failure.node_ids) == {"a", "b"}
    assert all("available" in s.arithmetic for s in failure.shortfalls)


def test_pool_refuses_tensor_sharding_with_a_reason():
    resources = {n: res(n, 64 * GB, LLAMA_CPU) for n in "ab"}
    failure = _fails(GGUF_8B, cluster("ab", ["a-b"]), resources, request(GGUF_8B, min_nodes=2, sharding="Tensor"))
    assert isinstance(failure, ShardingUnsupported)


def test_preview_lists_the_pool_with_each_ranks_memory():
    resources = {"a": res("a", 6 * GB, LLAMA_CPU), "b": res("b", 3 * GB, LLAMA_CPU)}
    options = preview(GGUF_8B, cluster("ab", ["a-b"]), resources)
    assert options, "a pooled placement is feasible"
    best = options[0]
    assert best.node_ids == ["a", "b"]
    assert [(s.rank, s.backend) for s in best.shards] == [(0, "llama_cpp-cpu"), (1, "llama_cpp-cpu")]
    assert all(0 < s.needed_bytes < s.available_bytes for s in best.shards)
    assert sum(s.end_layer - s.start_layer for s in best.shards) == GGUF_8B.num_layers
