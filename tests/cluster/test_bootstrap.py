"""A new node bootstraps a long history: snapshot plus a paced replay of the retained tail."""

import asyncio
import time

from skulk.cluster.commander import Commander
from skulk.shared.types.commands import EvictStagedModel
from skulk.shared.types.ids import new_id
from tests.cluster.harness import cluster, start_linked, wait_agreed
from tests.nodeproc import NodeProcess, wait_for

HISTORY_EVENTS = 10_000
BATCH = 500


async def make_history(master: NodeProcess, key: str, endpoint: str, count: int) -> None:
    """`count` indexed events through real commands; paced so the master's queues never overflow."""
    start_idx = cluster(master)["lastEventIdx"]
    async with await Commander.connect(key, [endpoint]) as commander:
        deadline = time.monotonic() + 20
        while commander.connected_peers() == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        sent = 0
        while sent < count:
            for i in range(sent, min(sent + BATCH, count)):
                await commander.submit(EvictStagedModel(command_id=new_id(), model_id=f"bench/model-{i}"))
            sent = min(sent + BATCH, count)
            target = start_idx + sent
            await asyncio.to_thread(
                wait_for, lambda t=target: cluster(master)["lastEventIdx"] >= t, timeout_s=60, what=f"idx {target}"
            )


def test_new_node_bootstraps_a_10k_event_history(spawn_node):
    (a,) = start_linked(spawn_node, ["a"])
    wait_agreed([a], members=1)
    endpoint = a.extra_args[a.extra_args.index("--listen") + 1]
    asyncio.run(make_history(a, "test-cluster-key", endpoint, HISTORY_EVENTS))
    history = cluster(a)["lastEventIdx"]
    assert history >= HISTORY_EVENTS

    b = spawn_node("b", extra_args=["--listen", "tcp/127.0.0.1:0", "--cluster-key", "test-cluster-key",
                                    "--node-name", "b", "--bootstrap-peers", endpoint]).wait_ready()
    view = wait_agreed([a, b], members=2, timeout_s=90, what="bootstrap of a 10k-event history")
    assert view["lastEventIdx"] >= history
    replica = b.get("/v1/diagnostics/node").json()["replica"]
    assert replica["snapshotsAdopted"] >= 1
    master = a.get("/v1/diagnostics/node").json()["master"]
    assert master["snapshotsSent"] >= 1
    # The follower did not replay 10k events one by one: it adopted a snapshot near the head.
    assert master["snapshotIdx"] >= history - 512 - 20
