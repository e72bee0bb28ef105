"""Ring hosts for multi-node MLX instances: the address each rank listens on, chosen from the
topology by transport, and how placement stamps them."""

from __future__ import annotations

import pytest

from skulk.master.ring_hosts import choose_ring_hosts, host_of, ring_hosts_for, unreported_ring_nodes
from skulk.shared.types.common import Edge, NetworkInterface
from skulk.shared.types.ids import InstanceId, ModelId, NodeId, RunnerId
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.state import State

A, B, C = NodeId("a"), NodeId("b"), NodeId("c")


def nic(kind: str, *addresses: str, name: str = "if") -> NetworkInterface:
    return NetworkInterface(name=f"{name}-{kind}", addresses=list(addresses), kind=kind)


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("10.0.0.2", "10.0.0.2"),
        ("10.0.0.2/24", "10.0.0.2"),
        ("tcp/10.0.0.2:7447", "10.0.0.2"),
        ("http://10.0.0.2:52415", "10.0.0.2"),
        ("http://[fe80::1]:52415", "fe80::1"),
        ("fe80::1", "fe80::1"),
        ("node-b.local", None),
    ],
)
def test_host_of(address, host) -> None:
    assert host_of(address) == host


@pytest.mark.parametrize(
    ("network", "edges", "nodes", "expected"),
    [
        # One node: the runners use loopback themselves.
        ({A: [nic("ethernet", "10.0.0.1")]}, [], [A, A], []),
        # Ethernet beats Wi-Fi; loopback is never chosen.
        (
            {A: [nic("loopback", "127.0.0.1"), nic("wifi", "192.168.1.10"), nic("ethernet", "10.0.0.1")],
             B: [nic("ethernet", "10.0.0.2")]},
            [], [A, B], ["10.0.0.1", "10.0.0.2"],
        ),
        # Thunderbolt first; overlay (Tailscale CGNAT) strictly last even on an 'other' interface.
        (
            {A: [nic("other", "100.100.1.1"), nic("thunderbolt", "169.254.10.1")],
             B: [nic("other", "100.100.1.2"), nic("wifi", "192.168.1.11")]},
            [], [A, B], ["169.254.10.1", "192.168.1.11"],
        ),
        # An address a member actually reached wins over an equally ranked one it did not.
        (
            {A: [nic("ethernet", "10.0.0.1")], B: [nic("ethernet", "10.0.0.2", "10.0.1.2")]},
            [Edge(source=A, sink=B, kind="probed", address="http://10.0.1.2:52415")],
            [A, B], ["10.0.0.1", "10.0.1.2"],
        ),
        # A node with no usable address: no guess, the runner refuses with a reason.
        ({A: [nic("ethernet", "10.0.0.1")], B: [nic("loopback", "127.0.0.1")]}, [], [A, B], []),
        # Two ranks on one node of a multi-node instance share its host (ports differ per rank).
        (
            {A: [nic("ethernet", "10.0.0.1")], C: [nic("ethernet", "10.0.0.3")]},
            [], [A, A, C], ["10.0.0.1", "10.0.0.1", "10.0.0.3"],
        ),
    ],
)
def test_choose_ring_hosts(network, edges, nodes, expected) -> None:
    assert choose_ring_hosts(nodes, State(node_network=network, edges=edges)) == expected


def instance(backend: str) -> Instance:
    return Instance(
        instance_id=InstanceId("i"), model_id=ModelId("m"), sharding="Pipeline", context_token_limit=64,
        shards=[ShardAssignment(node_id=n, runner_id=RunnerId(f"r{r}"), rank=r, world_size=2, start_layer=r,
                                end_layer=r + 1, backend=backend) for r, n in enumerate((A, B))],
    )


def test_only_spanning_engines_get_ring_hosts() -> None:
    state = State(node_network={A: [nic("ethernet", "10.0.0.1")], B: [nic("ethernet", "10.0.0.2")]})
    assert ring_hosts_for(instance("mlx-cpu"), state) == ["10.0.0.1", "10.0.0.2"]
    # A llama.cpp pool: the driver dials each donor's pool channel at its host.
    assert ring_hosts_for(instance("llama_cpp-cpu"), state) == ["10.0.0.1", "10.0.0.2"]
    assert ring_hosts_for(instance("vllm-cuda"), state) == []


@pytest.mark.parametrize(
    ("network", "backend", "expected"),
    [
        ({}, "mlx-cpu", []),  # no node reports networks (a bare state): nothing to wait for
        ({A: [nic("ethernet", "10.0.0.1")]}, "mlx-cpu", [B]),  # b's report is still gossiping
        ({A: [nic("ethernet", "10.0.0.1")], B: [nic("loopback", "127.0.0.1")]}, "mlx-cpu", []),  # reported, unusable
        ({A: [nic("ethernet", "10.0.0.1")]}, "llama_cpp-cpu", [B]),
        ({A: [nic("ethernet", "10.0.0.1")]}, "vllm-cuda", []),
    ],
)
def test_placement_waits_only_for_unreported_ring_nodes(network, backend, expected) -> None:
    assert unreported_ring_nodes(instance(backend), State(node_network=network)) == expected
