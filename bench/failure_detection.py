"""Failure detection benchmark: how long a frozen (SIGSTOP) node takes to be declared lost,
stage by stage, and whether a live node that stalls briefly is left alone.

Three real nodes on loopback. Each round SIGSTOPs a non-master node and polls the master
(every POLL_S) for the stages of detection:
- link: the master's zenoh transport to the node is gone (`connectedPeers` drops: the
  transport lease ran out);
- presence: the node left the master's presence set (its liveliness token withdrawn with
  the link, or its session failed its presence challenges);
- pruned: the master's State no longer lists the node (the presence-loss verdict, after its
  hysteresis): the moment every stream the node served ends with a typed error.
Then SIGCONT and wait for the node to be back. The stall check then SIGSTOPs a node for a
few hundred ms (a live node on a loaded machine) and reports whether it was pruned anyway.

Each round's figure is +-POLL_S. Presence-driven prunes are budgeted per node
(`master/presence_loss.py`), so rounds alternate between the two non-master nodes and wait
out the budget when it is spent.

Usage: uv run python bench/failure_detection.py [--rounds 4] [--stalls 0.3,0.5,0.7]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster.harness import agreed, cluster, node_id
from tests.nodeproc import NodeProcess, free_port, wait_for

from skulk.master.presence_loss import MAX_PRESENCE_PRUNES, PRUNE_WINDOW_S

KEY = "bench-cluster-key"
POLL_S = 0.05
GIVE_UP_S = 45.0


def start(root: Path, names: list[str]) -> list[NodeProcess]:
    nodes, bootstrap = [], None
    for name in names:
        port = free_port()
        args = ["--listen", f"tcp/127.0.0.1:{port}", "--cluster-key", KEY, "--node-name", name]
        if bootstrap:
            args += ["--bootstrap-peers", bootstrap]
        nodes.append(NodeProcess(data_dir=root / name, api_port=free_port(), extra_args=args).start())
        bootstrap = bootstrap or f"tcp/127.0.0.1:{port}"
    for node in nodes:
        node.wait_ready()
    return nodes


def probe(master: NodeProcess, victim_id: str) -> tuple[int, bool, bool]:
    """(connected peers, victim in presence, victim in State) as the master sees them now."""
    transport = master.get("/v1/diagnostics/node").json()["transport"]
    alive = transport["presence"][0]["alive"] if transport["presence"] else []
    in_state = victim_id in master.get("/state").json()["nodes"]
    return transport["connectedPeers"], victim_id in alive, in_state


def one_round(master: NodeProcess, victim: NodeProcess, victim_id: str) -> dict[str, float]:
    peers_before, _, _ = probe(master, victim_id)
    victim.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    seen: dict[str, float] = {}
    try:
        while "pruned" not in seen and time.monotonic() - stopped < GIVE_UP_S:
            peers, present, in_state = probe(master, victim_id)
            at = time.monotonic() - stopped
            if peers < peers_before:
                seen.setdefault("link", at)
            if not present:
                seen.setdefault("presence", at)
            if not in_state:
                seen["pruned"] = at
            time.sleep(POLL_S)
    finally:
        victim.signal(signal.SIGCONT)
    return seen


def stall(master: NodeProcess, victim: NodeProcess, victim_id: str, stall_s: float, watch_s: float = 6.0) -> str:
    victim.signal(signal.SIGSTOP)
    time.sleep(stall_s)
    victim.signal(signal.SIGCONT)
    resumed = time.monotonic()
    blinked = pruned = False
    while time.monotonic() - resumed < watch_s:
        _, present, in_state = probe(master, victim_id)
        blinked |= not present
        pruned |= not in_state
        time.sleep(POLL_S)
    return "PRUNED" if pruned else ("presence blinked, not pruned" if blinked else "untouched")


def spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    return (f"median {statistics.median(values):.2f}s, min {min(values):.2f}s, max {max(values):.2f}s "
            f"(n={len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--stalls", default="0.3,0.5,0.7")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="skulk-bench-fd-") as tmp:
        nodes = start(Path(tmp), ["fd-a", "fd-b", "fd-c"])
        try:
            wait_for(lambda: agreed(nodes, members=3), timeout_s=90, interval_s=0.25, what="3 members")
            ids = {node_id(n): n for n in nodes}
            master_id = cluster(nodes[0])["masterNodeId"]
            master = ids[master_id]
            victims = [n for n in ids if n != master_id]
            prunes: dict[str, list[float]] = {v: [] for v in victims}
            stages: dict[str, list[float]] = {"link": [], "presence": [], "pruned": []}
            for r in range(args.rounds):
                victim_id = victims[r % len(victims)]
                recent = [t for t in prunes[victim_id] if time.monotonic() - t < PRUNE_WINDOW_S]
                if len(recent) >= MAX_PRESENCE_PRUNES:  # the master would leave it to the 30 s timeout
                    wait_s = PRUNE_WINDOW_S - (time.monotonic() - recent[0]) + 1
                    print(f"  (waiting {wait_s:.0f}s for {victim_id[:8]}'s prune budget)", flush=True)
                    time.sleep(wait_s)
                seen = one_round(master, ids[victim_id], victim_id)
                prunes[victim_id].append(time.monotonic())
                for stage in stages:
                    if stage in seen:
                        stages[stage].append(seen[stage])
                print(f"round {r + 1}: " + ", ".join(f"{k} {v:.2f}s" for k, v in seen.items()), flush=True)
                wait_for(lambda: agreed(nodes, members=3), timeout_s=90, interval_s=0.25, what="the node back")
            print("\nSIGSTOP of a non-master node, seconds from the signal, as the master sees it:")
            for stage, values in stages.items():
                print(f"  {stage:9s} {spread(values)}")
            print("\nBrief stalls of a live node (SIGSTOP then SIGCONT), watched 6 s:")
            for i, stall_s in enumerate(float(s) for s in args.stalls.split(",") if s):
                victim_id = victims[i % len(victims)]
                print(f"  {stall_s:.2f}s stall: {stall(master, ids[victim_id], victim_id, stall_s)}", flush=True)
                wait_for(lambda: agreed(nodes, members=3), timeout_s=90, interval_s=0.25, what="the node back")
        finally:
            for node in nodes:
                node.signal(signal.SIGCONT)
                node.stop()
    print(f"\nload average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (1-minute)")


if __name__ == "__main__":
    main()
