"""A node with the wrong cluster key never half-joins: it is counted, not admitted."""

import time

from tests.cluster.harness import cluster, node_id, start_linked, wait_agreed
from tests.nodeproc import wait_for


def test_node_with_wrong_key_never_appears_and_nothing_it_sends_is_indexed(spawn_node):
    good = start_linked(spawn_node, ["a", "b"])
    view = wait_agreed(good, members=2)
    intruder_port = good[0].extra_args[good[0].extra_args.index("--listen") + 1]
    intruder = spawn_node("intruder", extra_args=[
        "--cluster-key", "some-other-key", "--node-name", "intruder", "--bootstrap-peers", intruder_port,
    ]).wait_ready()
    intruder_id = node_id(intruder)

    # The good nodes see the intruder's traffic and reject it as unauthenticated.
    def rejected():
        diagnostics = good[0].get("/v1/diagnostics/node").json()
        return diagnostics["transport"]["rejected"].get("auth", 0) > 0

    wait_for(rejected, timeout_s=30, what="auth rejections counted")
    # Give the intruder time to try everything it would do as a member (elect, join, edges).
    time.sleep(6)
    for node in good:
        state = node.get("/state").json()
        assert intruder_id not in state["nodes"]
        assert all(intruder_id not in (e["source"], e["sink"]) for e in state["edges"])
        assert intruder_id not in {n["nodeId"] for n in cluster(node)["nodes"]}
    after = wait_agreed(good, members=2)
    assert after["masterNodeId"] == view["masterNodeId"]
    # The intruder formed a cluster of one with itself, and never saw the good nodes.
    assert {n["nodeId"] for n in cluster(intruder)["nodes"]} <= {intruder_id}
