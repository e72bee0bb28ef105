"""Discovery with no bootstrap peers: multicast scouting between two network namespaces.

Each node runs in its own namespace joined by a veth pair (addresses from the benchmarking
range 198.18.0.0/15), so scouting traffic never leaves the test's own links."""

import os
import shutil
import subprocess

import pytest

from tests.cluster.harness import wait_agreed

SUBNET = "198.18.{}.{}"


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


@pytest.fixture
def two_namespaces():
    if shutil.which("ip") is None or shutil.which("curl") is None:
        pytest.skip("needs iproute2 and curl")
    tag = f"{os.getpid() % 10000}"
    names = [f"skulk-a{tag}", f"skulk-b{tag}"]
    veth = [f"sk{tag}a", f"sk{tag}b"]
    created: list[str] = []
    try:
        for ns in names:
            result = _ip("netns", "add", ns)
            if result.returncode != 0:
                pytest.skip(f"network namespaces unavailable here: {result.stderr.strip()}")
            created.append(ns)
        steps = [
            ("link", "add", veth[0], "type", "veth", "peer", "name", veth[1]),
            ("link", "set", veth[0], "netns", names[0]),
            ("link", "set", veth[1], "netns", names[1]),
        ]
        third = int(tag) % 250
        for i, ns in enumerate(names):
            address = SUBNET.format(third, i + 1)
            steps += [
                ("-n", ns, "addr", "add", f"{address}/24", "dev", veth[i]),
                ("-n", ns, "link", "set", veth[i], "up"),
                ("-n", ns, "link", "set", "lo", "up"),
                ("-n", ns, "route", "add", "224.0.0.0/4", "dev", veth[i]),
            ]
        for step in steps:
            result = _ip(*step)
            if result.returncode != 0:
                pytest.skip(f"cannot build the namespace link ({' '.join(step)}): {result.stderr.strip()}")
        yield names, [SUBNET.format(third, 1), SUBNET.format(third, 2)]
    finally:
        for ns in created:
            _ip("netns", "del", ns)


def test_two_namespaces_discover_each_other_by_multicast(spawn_node, two_namespaces):
    names, addresses = two_namespaces
    nodes = [
        spawn_node(f"mc{i}", netns=ns, multicast=True, api_host=addresses[i], port=52415,
                   extra_args=["--cluster-key", "netns-key", "--node-name", f"mc{i}"])
        for i, ns in enumerate(names)
    ]
    for node in nodes:
        node.wait_ready()
    view = wait_agreed(nodes, members=2, timeout_s=60, what="multicast discovery across namespaces")
    assert {n["name"] for n in view["nodes"]} == {"mc0", "mc1"}
