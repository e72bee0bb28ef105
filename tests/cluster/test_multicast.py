"""Discovery with no bootstrap peers: multicast scouting between two network namespaces.

Each node runs in its own namespace joined by a veth pair (addresses from the benchmarking
range 198.18.0.0/15), so scouting traffic never leaves the test's own links."""

from tests.cluster.harness import wait_agreed
from tests.netns import two_namespaces  # noqa: F401 - fixture


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
