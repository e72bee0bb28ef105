"""Control-plane benchmark: real node processes on loopback, figures measured in one run.

Prints:
- end-to-end events/s: commands submitted at a FOLLOWER's transport until the resulting
  events are applied on every node, beside the raw rate at which the same commander can
  publish (the transport alone), and their ratio;
- failover seconds: kill -9 of the master until the survivors agree on a new master, and
  until the dead node is pruned (NodeTimedOut, 30 s by design);
- bootstrap seconds: a fresh node joining a cluster with a 10k-event history until its
  state hash equals the master's.

Usage: uv run python bench/control_plane.py [--events 5000] [--history 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster.harness import agreed, cluster, node_id
from tests.nodeproc import NodeProcess, free_port, wait_for

from skulk.cluster.commander import Commander
from skulk.shared.types.commands import EvictStagedModel
from skulk.shared.types.ids import new_id

KEY = "bench-cluster-key"
BATCH = 500


def start(root: Path, names: list[str], bootstrap: str | None = None) -> list[NodeProcess]:
    nodes = []
    for name in names:
        port = free_port()
        args = ["--listen", f"tcp/127.0.0.1:{port}", "--cluster-key", KEY, "--node-name", name]
        if bootstrap:
            args += ["--bootstrap-peers", bootstrap]
        node = NodeProcess(data_dir=root / name, api_port=free_port(), extra_args=args)
        nodes.append(node.start())
        bootstrap = bootstrap or f"tcp/127.0.0.1:{port}"
    for node in nodes:
        node.wait_ready()
    return nodes


def endpoint(node: NodeProcess) -> str:
    return node.extra_args[node.extra_args.index("--listen") + 1]


def wait_all_at(nodes: list[NodeProcess], idx: int, timeout_s: float = 120) -> None:
    wait_for(lambda: all(cluster(n)["lastEventIdx"] >= idx for n in nodes), timeout_s=timeout_s, interval_s=0.02,
             what=f"idx {idx} everywhere")


async def submit_paced(commander: Commander, nodes: list[NodeProcess], count: int) -> float:
    """Submit `count` commands in batches, each batch applied everywhere before the next."""
    start_idx = cluster(nodes[0])["lastEventIdx"]
    started = time.perf_counter()
    sent = 0
    while sent < count:
        batch = min(BATCH, count - sent)
        for i in range(batch):
            await commander.submit(EvictStagedModel(command_id=new_id(), model_id=f"bench/m-{sent + i}"))
        sent += batch
        await asyncio.to_thread(wait_all_at, nodes, start_idx + sent)
    return time.perf_counter() - started


async def raw_publish_rate(commander: Commander, count: int) -> float:
    """Publish-only rate of the same commander (commands the master refuses: nothing indexed)."""
    from skulk.shared.types.commands import DeleteInstance

    started = time.perf_counter()
    for _ in range(count):
        await commander.submit(DeleteInstance(command_id=new_id(), instance_id="no-such-instance"))
    return count / (time.perf_counter() - started)


async def throughput(nodes: list[NodeProcess], count: int) -> tuple[float, float]:
    master_id = cluster(nodes[0])["masterNodeId"]
    follower = next(n for n in nodes if node_id(n) != master_id)
    async with await Commander.connect(KEY, [endpoint(follower)]) as commander:
        deadline = time.monotonic() + 20
        while commander.connected_peers() == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # let the commander's routes settle before timing
        raw = await raw_publish_rate(commander, min(count, 2000))
        elapsed = await submit_paced(commander, nodes, count)
    return count / elapsed, raw


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--history", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="skulk-bench-") as tmp:
        root = Path(tmp)
        nodes = start(root, ["a", "b", "c"])
        extra: list[NodeProcess] = []
        try:
            wait_for(lambda: agreed(nodes, members=3), timeout_s=60, what="formation")
            rate, raw = asyncio.run(throughput(nodes, args.events))
            print(f"end-to-end (follower command -> applied on 3 nodes): {rate:,.0f} events/s")
            print(f"transport only (commander publish rate):            {raw:,.0f} msgs/s")
            print(f"ratio end-to-end / transport:                        {rate / raw:.2f}")

            # Bootstrap a 10k-event history.
            have = cluster(nodes[0])["lastEventIdx"]
            more = max(0, args.history - have)
            if more:
                asyncio.run(throughput(nodes, more))
            history = cluster(nodes[0])["lastEventIdx"]
            started = time.perf_counter()
            extra = start(root, ["joiner"], bootstrap=endpoint(nodes[0]))
            wait_for(lambda: agreed([*nodes, *extra], members=4), timeout_s=120, interval_s=0.05, what="bootstrap")
            print(f"bootstrap of a {history + 1:,}-event history (process start to equal state): "
                  f"{time.perf_counter() - started:.2f} s")

            # Failover.
            master_id = cluster(nodes[0])["masterNodeId"]
            master = next(n for n in nodes if node_id(n) == master_id)
            survivors = [n for n in [*nodes, *extra] if n is not master]
            started = time.perf_counter()
            master.proc.send_signal(signal.SIGKILL)

            def new_master():
                views = [cluster(n) for n in survivors]
                masters = {v["masterNodeId"] for v in views}
                return len(masters) == 1 and master_id not in masters

            wait_for(new_master, timeout_s=60, interval_s=0.05, what="new master")
            print(f"failover (kill -9 of the master -> survivors agree on a new master): "
                  f"{time.perf_counter() - started:.2f} s")
            wait_for(lambda: agreed(survivors, members=len(survivors)), timeout_s=90, interval_s=0.1, what="prune")
            print(f"prune of the dead master (NodeTimedOut, 30 s timeout by design):     "
                  f"{time.perf_counter() - started:.2f} s")
        finally:
            for node in [*nodes, *extra]:
                node.stop()


if __name__ == "__main__":
    main()
