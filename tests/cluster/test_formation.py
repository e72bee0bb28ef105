"""Real node processes on loopback form one cluster: one master, one history."""

import signal

import httpx

from tests.cluster.harness import cluster, node_id, start_linked, wait_agreed
from tests.nodeproc import wait_for


def test_three_nodes_agree_on_one_master_and_state(spawn_node):
    nodes = start_linked(spawn_node, ["a", "b", "c"])
    view = wait_agreed(nodes, members=3, what="three nodes agreeing")
    ids = {node_id(n) for n in nodes}
    assert view["masterNodeId"] in ids
    assert {n["nodeId"] for n in view["nodes"]} == ids
    assert {n["name"] for n in view["nodes"]} == {"a", "b", "c"}
    # Resources ride the best-effort telemetry plane every 5 s: they arrive, if not at once.
    wait_for(lambda: all((n["memory"]["total"] or 0) > 0 for m in nodes for n in cluster(m)["nodes"]),
             timeout_s=30, what="every node's memory reading everywhere")

    # The topology fills in: session edges from live authenticated sessions (every ordered
    # pair) and probed edges from verified API addresses; then every node's full State is
    # identical (not just the summary hash).
    every_pair = {(a, b) for a in ids for b in ids if a != b}

    def topology_complete():
        state = replicated_state(nodes[0])
        kinds = {(e["source"], e["sink"], e["kind"]) for e in state["edges"]}
        return all((a, b, k) in kinds for a, b in every_pair for k in ("session", "probed"))

    wait_for(topology_complete, timeout_s=45, what="session and probed edges between every pair")
    states = wait_for(lambda: same_everywhere(nodes), timeout_s=20, what="identical states")
    assert states["lastEventAppliedIdx"] >= view["lastEventIdx"]
    assert all(set(n.get("/state").json()["nodeHealth"]) == ids for n in nodes)


def test_a_command_at_a_follower_is_applied_everywhere(spawn_node):
    nodes = start_linked(spawn_node, ["a", "b"])
    view = wait_agreed(nodes, members=2)
    follower = next(n for n in nodes if node_id(n) != view["masterNodeId"])
    response = httpx.put(follower.url + "/v1/tracing", json={"enabled": True}, timeout=5)
    assert response.status_code == 202
    wait_for(lambda: all(n.get("/v1/tracing").json()["enabled"] for n in nodes), timeout_s=20, what="tracing on")
    after = wait_agreed(nodes, members=2)
    assert after["lastEventIdx"] > view["lastEventIdx"]


def test_kill_9_of_the_master_fails_over_without_index_reuse(spawn_node):
    nodes = start_linked(spawn_node, ["a", "b", "c"])
    before = wait_agreed(nodes, members=3)
    master = next(n for n in nodes if node_id(n) == before["masterNodeId"])
    survivors = [n for n in nodes if n is not master]
    master.proc.send_signal(signal.SIGKILL)
    master.proc.wait(timeout=10)

    # A new master, a new session; the dead one is pruned from State (NodeTimedOut at 30 s).
    after = wait_agreed(survivors, members=2, timeout_s=90, what="failover and prune")
    assert after["masterNodeId"] != before["masterNodeId"]
    assert after["sessionId"] != before["sessionId"]
    assert after["lastEventIdx"] > before["lastEventIdx"]
    assert before["masterNodeId"] not in {n["nodeId"] for n in after["nodes"]}

    # The new session keeps indexing after the old history, on every survivor alike.
    httpx.put(survivors[0].url + "/v1/tracing", json={"enabled": True}, timeout=5)
    wait_for(lambda: tracing_on(survivors), timeout_s=30, what="command after failover")
    final = wait_agreed(survivors, members=2)
    assert final["lastEventIdx"] > after["lastEventIdx"]
    # The old master's process is gone for good: its API does not answer.
    assert master.proc.returncode == -signal.SIGKILL
    assert cluster(survivors[1])["masterNodeId"] == final["masterNodeId"]


def replicated_state(node) -> dict:
    """The replicated part of GET /state (without the live telemetry overlay and health)."""
    body = node.get("/state").json()
    body.pop("nodeResources")
    body.pop("nodeHealth")
    body.pop("downloadProgress")
    return body


def same_everywhere(nodes):
    states = [replicated_state(n) for n in nodes]
    return states[0] if all(s == states[0] for s in states) else None


def tracing_on(nodes) -> bool:
    return all(n.get("/v1/tracing").json()["enabled"] for n in nodes)


def test_node_restarted_on_its_data_dir_rejoins(spawn_node):
    nodes = start_linked(spawn_node, ["a", "b"])
    wait_agreed(nodes, members=2)
    old_id = node_id(nodes[1])
    nodes[1].signal(signal.SIGTERM)
    assert nodes[1].wait_exit(timeout_s=10) == 0
    # A clean stop announces NodeLeft: the cluster shrinks at once, no 30 s timeout needed.
    wait_agreed(nodes[:1], members=1, timeout_s=20, what="clean leave")
    again = spawn_node("b2", data_dir=nodes[1].data_dir, extra_args=nodes[1].extra_args)
    again.wait_ready()
    view = wait_agreed([nodes[0], again], members=2, what="rejoin")
    ids = {n["nodeId"] for n in view["nodes"]}
    assert node_id(again) in ids and old_id not in ids
