"""Pure pool layout: llama.cpp's device split reproduces placement's layer ranges."""

from __future__ import annotations

import pytest

from skulk.pool.layout import (
    MAX_POOL_WORLD,
    POOL_PORT_BASE,
    POOL_PORT_SPAN,
    PoolLayoutError,
    channel_key,
    derive_pool_key,
    device_split,
    donor_host,
    donors,
    pool_port,
)
from skulk.shared.types.instances import Instance, ShardAssignment


def pool(counts, hosts=None, nodes=None, hop=0):
    shards, start = [], 0
    for rank, count in enumerate(counts):
        node = nodes[rank] if nodes else f"n{rank}"
        shards.append(ShardAssignment(node_id=node, runner_id=f"r{rank}", rank=rank, world_size=len(counts),
                                      start_layer=start, end_layer=start + count, backend="llama_cpp-cpu"))
        start += count
    return Instance(instance_id="i", model_id="m", sharding="Pipeline", shards=shards, context_token_limit=64,
                    ring_hosts=hosts or [], repair_hop=hop)


def assigned(n_layer: int, split) -> list[int]:
    """llama.cpp's own rule (llama-model.cpp load_tensors), device index per layer, -1 = CPU."""
    splits, total = [], sum(split.tensor_split)
    acc = 0.0
    for w in split.tensor_split:
        acc += w
        splits.append(acc / total)
    start = max(n_layer + 1 - split.n_gpu_layers, 0)
    act = min(split.n_gpu_layers, n_layer + 1)
    out = []
    for il in range(n_layer + 1):
        if il < start or il - start >= act:
            out.append(-1)
        else:
            out.append(next(j for j, s in enumerate(splits) if s > (il - start) / act))
    return out


@pytest.mark.parametrize(("counts", "expected"), [
    ([3, 3], [-1, -1, -1, 0, 0, 0, 0]),
    ([2, 2, 2], [-1, -1, 0, 0, 1, 1, 1]),
    ([21, 11], [-1] * 21 + [0] * 12),
    ([1, 5], [-1, 0, 0, 0, 0, 0, 0]),
])
def test_cpu_driver_split_reproduces_the_ranges(counts, expected):
    split = device_split(pool(counts).shards, sum(counts))
    assert assigned(sum(counts), split) == expected  # the last entry is the output layer


def test_a_driver_with_its_own_accelerator_puts_its_range_on_device_zero():
    split = device_split(pool([2, 2, 2]).shards, 6, driver_device=True)
    assert assigned(6, split) == [0, 0, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("shards", [pool([6]).shards, [*pool([3, 3]).shards[:1]]])
def test_a_pool_needs_a_donor(shards):
    with pytest.raises(PoolLayoutError):
        device_split(shards, 6)


def test_ports_are_derived_per_placement_and_rank():
    a, b = pool([3, 3]), pool([3, 3], hop=1)
    assert POOL_PORT_BASE <= pool_port(a, 1) < POOL_PORT_BASE + POOL_PORT_SPAN
    assert pool_port(a, 1) == pool_port(pool([3, 3]), 1)
    assert pool_port(a, 1) != pool_port(b, 1)
    with pytest.raises(PoolLayoutError):
        pool_port(a, 0)  # the driver listens on none
    with pytest.raises(PoolLayoutError):
        pool_port(a, MAX_POOL_WORLD)


def test_donor_hosts_come_from_placement_or_loopback_on_one_node():
    assert donor_host(pool([3, 3], hosts=["10.0.0.1", "10.0.0.2"]), 1) == "10.0.0.2"
    assert donor_host(pool([3, 3], nodes=["a", "a"]), 1) == "127.0.0.1"
    with pytest.raises(PoolLayoutError, match="no addresses"):
        donor_host(pool([3, 3]), 1)
    assert [(d.rank, d.node_id, d.host) for d in donors(pool([2, 2, 2], hosts=["h0", "h1", "h2"]))] == [
        (1, "n1", "h1"), (2, "n2", "h2")]


def test_keys_are_bound_to_the_cluster_and_each_donor():
    key = derive_pool_key("cluster secret")
    assert key == derive_pool_key(" cluster secret\n") != derive_pool_key("another")
    inst = pool([2, 2, 2])
    assert channel_key(key, inst, 1) != channel_key(key, inst, 2)
    assert channel_key(key, inst, 1) != channel_key(key, pool([2, 2, 2], hop=1), 1)
