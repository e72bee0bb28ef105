"""kill -9 of one rank's node during generation, with real node processes on loopback: the
client's stream ends with an error naming the lost node, and the model is placed again on the
survivors, where it serves.

Three nodes: the master hosts no rank (the placement excludes it, as an operator might), so
either rank's node can be killed without a master failover, and the client streams through
the master's API. Killing rank 1's node exercises the ring's own report (rank 0 names the
node whose socket closed, in seconds); killing rank 0's node exercises the master's prune
(TaskFailed "node X lost" once the node's presence is gone, well before the node timeout). The re-placement keeps the operator's
exclusion, so it lands on the one surviving rank's node, narrower than before.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable

import httpx
import psutil
import pytest

from tests.cluster.harness import cluster, node_id, start_linked, wait_agreed
from tests.cluster.test_mlx_pipeline import MODEL, READY_DEADLINE_S, place_two_nodes
from tests.nodeproc import NodeProcess, wait_for

pytestmark = pytest.mark.timeout(420)

NODE_TIMEOUT_S = 10.0
"""The master's prune timeout for this test (SKULK_TEST_NODE_TIMEOUT_SECONDS): well above the
2 s heartbeat, so a busy machine does not prune a live node, and short enough that the
re-placement does not wait the production 30 s."""
ERROR_DEADLINE_S = 45.0
"""Hang guard from the kill to the stream's error event. Expected: a few seconds (the ring
reports the closed socket) or NODE_TIMEOUT_S (the master prunes the node), whichever rank died."""
REPLACED_DEADLINE_S = 150.0
"""Hang guard for the re-placed instance to serve: prune, teardown of the old runner, then a
fresh runner importing mlx and loading on a loaded 2-core machine."""
PROMPT = [{"role": "user", "content": "the the the the"}]


def ready_runners(node: NodeProcess, instance_id: str) -> bool:
    state = node.get("/state").json()
    instance = state["instances"].get(instance_id)
    if instance is None:
        return False
    statuses = [state["runners"].get(s["runnerId"], {}).get("state") for s in instance["shards"]]
    return all(s == "Ready" for s in statuses)


def kill_node(node: NodeProcess) -> None:
    """kill -9 the node process, then the runner processes it had started, as when its
    machine dies. (A runner whose node alone is killed exits by itself within
    PARENT_WATCH_INTERVAL_S, tested with the supervisor; meanwhile its rank keeps serving, and
    a fast machine could finish the whole generation before the loss shows.)"""
    runners = psutil.Process(node.proc.pid).children(recursive=True)
    node.proc.send_signal(signal.SIGKILL)
    for runner in runners:
        with contextlib.suppress(psutil.NoSuchProcess):
            runner.kill()


def stream_until_killed(api: NodeProcess, kill: Callable[[], None]) -> tuple[str, list[str], float]:
    """Stream a long chat through `api`; `kill` after a few chunks. Returns (error message,
    chunks seen, seconds from the kill to the error event)."""
    texts: list[str] = []
    killed_at: float | None = None
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 1900, "temperature": 0, "stream": True}
    with httpx.stream("POST", api.url + "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                assert killed_at is not None, f"the stream failed before the kill: {event}"
                return event["error"]["message"], texts, time.monotonic() - killed_at
            choice = event["choices"][0] if event.get("choices") else {}
            texts.append((choice.get("delta") or {}).get("content") or "")
            assert choice.get("finish_reason") is None, f"generation ended before the kill could land: {event}"
            if killed_at is None and len(texts) >= 3:
                kill()
                killed_at = time.monotonic()
    raise AssertionError(f"the stream ended without an error event after {len(texts)} chunks")


@pytest.mark.parametrize("victim_rank", [1, 0], ids=["rank-1-ring-reports", "rank-0-master-prunes"])
def test_kill_9_of_a_ranks_node_fails_the_stream_by_name_and_replaces_on_the_survivors(
    spawn_node, victim_rank: int
) -> None:
    env = {"SKULK_TEST_NODE_TIMEOUT_SECONDS": str(NODE_TIMEOUT_S)}
    nodes = start_linked(lambda name, **kw: spawn_node(name, env=env, **kw), ["loss-a", "loss-b", "loss-c"])
    wait_agreed(nodes, members=3)
    wait_for(lambda: len(nodes[0].get("/state").json()["nodeNetwork"]) == 3, timeout_s=60,
             interval_s=0.25, what="every node's network in State")
    ids = {node_id(n): n for n in nodes}
    master_id = cluster(nodes[0])["masterNodeId"]
    master = ids[master_id]

    old = place_two_nodes(master, excluded=(master_id,))
    ranks = {s["rank"]: s["nodeId"] for s in old["shards"]}
    assert sorted(ranks) == [0, 1] and master_id not in ranks.values()
    try:
        wait_for(lambda: ready_runners(master, old["instanceId"]), timeout_s=READY_DEADLINE_S, interval_s=0.5,
                 what="both ranks Ready")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n" + "\n".join(n.log()[-4000:] for n in nodes)) from None
    victim_id, kept_id = ranks[victim_rank], ranks[1 - victim_rank]
    victim = ids[victim_id]

    message, texts, waited_s = stream_until_killed(master, lambda: kill_node(victim))
    assert victim.wait_exit(timeout_s=10) == -signal.SIGKILL
    assert victim_id in message and "lost" in message, message  # names the lost node
    assert waited_s < ERROR_DEADLINE_S, (waited_s, message)
    print(f"rank {victim_rank} lost after {len(texts)} chunks; error after {waited_s:.1f}s: {message}")

    def replaced() -> dict | None:
        state = master.get("/state").json()
        if old["instanceId"] in state["instances"] or victim_id in state["nodes"]:
            return None
        mine = [i for i in state["instances"].values() if i["modelId"] == MODEL]
        return mine[0] if len(mine) == 1 and ready_runners(master, mine[0]["instanceId"]) else None

    try:
        new = wait_for(replaced, timeout_s=REPLACED_DEADLINE_S, interval_s=0.5, what="the model Ready on a survivor")
    except TimeoutError as exc:
        state = master.get("/state").json()
        raise AssertionError(f"{exc}\ninstances {state['instances']}\nrunners {state['runners']}\n"
                             f"repairs {state.get('repairFailures')}\n{master.log()[-6000:]}") from None
    # On the survivors only, and the operator's exclusion of the master still holds.
    assert {s["nodeId"] for s in new["shards"]} == {kept_id}
    assert new["excludedNodes"] == [master_id]
    response = httpx.post(master.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": PROMPT, "max_tokens": 8, "temperature": 0,
    })
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]
