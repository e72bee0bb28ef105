"""kill -9 of one rank's runner mid-generation while its node stays up, real processes on
loopback: the client's stream ends with an error naming that rank's node, the lone rank is
not restarted (it could never rejoin a formed group), and the master re-places the group
under a fresh instance id (fresh ring ports), which serves, with no operator action."""

from __future__ import annotations

import signal

import httpx
import psutil
import pytest

from tests.cluster.harness import cluster, node_id, start_linked, wait_agreed
from tests.cluster.test_mlx_pipeline import MODEL, READY_DEADLINE_S, place_two_nodes
from tests.cluster.test_node_loss import PROMPT, ready_runners, stream_until_killed
from tests.nodeproc import NodeProcess, wait_for

pytestmark = pytest.mark.timeout(420)

ERROR_DEADLINE_S = 30.0
"""Hang guard from the kill to the stream's error event (expected: about a second, the ring
reports the closed socket)."""
SERVES_AGAIN_DEADLINE_S = 180.0
"""Hang guard for the re-placed group to serve: the grace, the old runners' teardown, then two
fresh runners importing mlx and forming a group on a loaded 2-core machine."""


def kill_runners(node: NodeProcess) -> None:
    for child in psutil.Process(node.proc.pid).children(recursive=True):
        child.send_signal(signal.SIGKILL)


def test_kill_9_of_one_ranks_runner_fails_the_stream_and_the_group_is_replaced(spawn_node) -> None:
    nodes = start_linked(spawn_node, ["crash-a", "crash-b"])
    wait_agreed(nodes, members=2)
    wait_for(lambda: len(nodes[0].get("/state").json()["nodeNetwork"]) == 2, timeout_s=60,
             interval_s=0.25, what="every node's network in State")
    ids = {node_id(n): n for n in nodes}
    master = ids[cluster(nodes[0])["masterNodeId"]]
    old = place_two_nodes(master)
    wait_for(lambda: ready_runners(master, old["instanceId"]), timeout_s=READY_DEADLINE_S, interval_s=0.5,
             what="both ranks Ready")
    ranks = {s["rank"]: s["nodeId"] for s in old["shards"]}
    victim_id = ranks[1]

    message, _chunks, waited_s = stream_until_killed(ids[ranks[0]], lambda: kill_runners(ids[victim_id]))
    assert victim_id in message and "rank 1" in message, message
    assert waited_s < ERROR_DEADLINE_S, (waited_s, message)

    def serving_again() -> dict | None:
        state = master.get("/state").json()
        mine = [i for i in state["instances"].values() if i["modelId"] == MODEL]
        if old["instanceId"] in state["instances"] or len(mine) != 1:
            return None
        return mine[0] if ready_runners(master, mine[0]["instanceId"]) else None

    try:
        new = wait_for(serving_again, timeout_s=SERVES_AGAIN_DEADLINE_S, interval_s=1.0,
                       what="the group re-placed and Ready")
    except TimeoutError as exc:
        state = master.get("/state").json()
        raise AssertionError(f"{exc}\ninstances {state['instances']}\nrunners {state['runners']}\n"
                             f"repairs {state.get('repairFailures')}\n{master.log()[-6000:]}") from None
    assert len(new["shards"]) == 2 and new["repairHop"] == 1
    assert all(node.proc.poll() is None for node in nodes)  # no node was lost
    response = httpx.post(master.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": PROMPT, "max_tokens": 8, "temperature": 0,
    })
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]
