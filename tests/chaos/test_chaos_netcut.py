"""Chaos: seeded network cuts between namespaces while streaming clients run.

Three real nodes, each in its own network namespace on one switch (`tests.netns.Star`), and
the test's own namespace plugged into the same switch, so two client threads stream short
chats straight to the entry node's address the whole time. A seeded schedule
(`SKULK_CHAOS_SEED`, default 4; `SKULK_CHAOS_CUTS` cuts, default 2) unplugs one node's cable
for a drawn time (CUT_MIN_S..CUT_MAX_S), then plugs it back: the node serving the model, the
master, or the idle third node (never the entry node, a non-master the clients go through). The
schedule is bounded (count, each cut's length, each recovery's deadline) and stops by
itself. After each heal the cluster must recover: three members agreeing, the model serving.
The run ends by checking and printing the invariants:

- every request ended: completed, or a typed error; none hung, none ended untyped;
- no index reused: every node's `lastEventIdx` never went backwards;
- a cut never changes the master unless the master itself was cut (then the majority may
  elect a new one, which the healed old master follows);
- every node agrees on `stateHash`; the model serves again.

Skips, saying why, where network namespaces cannot be made (no root, no iproute2).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.chaos.test_chaos import CLIENT_TIMEOUT_S, CLIENTS, MODEL, PROMPT, Ledger, _one_request
from tests.cluster.harness import agreed, cluster, node_id
from tests.netns import Star, build_star, remove_namespaces
from tests.nodeproc import NodeProcess, wait_for

SEED = int(os.environ.get("SKULK_CHAOS_SEED", "4"))
CUTS = int(os.environ.get("SKULK_CHAOS_CUTS", "2"))
CUT_KINDS = ("cut-server", "cut-master", "cut-idle")
CUT_MIN_S, CUT_MAX_S = 3.0, 8.0
"""A cut's length: always past the 1 s transport lease (both sides lose presence and the
master prunes the cut node), often past a cut node's first campaign window."""
RECOVERY_DEADLINE_S = 120.0
ZENOH_PORT = 7447
API_PORT = 52415

pytestmark = pytest.mark.timeout(int(120 + CUTS * (CUT_MAX_S + RECOVERY_DEADLINE_S + 30)))


@pytest.fixture
def star() -> Iterator[Star]:
    built, why, created = build_star(3, uplink=True)
    try:
        if built is None:
            pytest.skip(why)
        yield built
    finally:
        remove_namespaces(created)


def test_seeded_network_cuts_keep_the_invariants(spawn_node, star: Star) -> None:
    rng = random.Random(SEED)
    schedule = [(rng.choice(CUT_KINDS), round(rng.uniform(CUT_MIN_S, CUT_MAX_S), 1)) for _ in range(CUTS)]
    print(f"\nnetwork-cut chaos seed {SEED}: schedule {schedule}")
    first = f"tcp/{star.addresses[0]}:{ZENOH_PORT}"
    nodes: list[NodeProcess] = []
    for i, address in enumerate(star.addresses):
        args = ["--listen", f"tcp/{address}:{ZENOH_PORT}", "--cluster-key", "cut-chaos-key", "--node-name", f"nc{i}"]
        if i:
            args += ["--bootstrap-peers", first]
        nodes.append(spawn_node(f"nc{i}", netns=star.names[i], api_host=address, port=API_PORT, extra_args=args))
    for node in nodes:
        node.wait_ready()
    wait_for(lambda: agreed(nodes, members=3), timeout_s=60, interval_s=0.25, what="a 3-node cluster")
    ids = [node_id(n) for n in nodes]
    # The clients' way in: a node that is not the master, so the master can be cut too.
    first_master = ids.index(cluster(nodes[0])["masterNodeId"])
    entry_index = next(i for i in range(3) if i != first_master)
    entry = nodes[entry_index]
    others = [i for i in range(3) if i != entry_index]
    url = f"http://{star.addresses[entry_index]}:{API_PORT}"  # through the switch, like any client

    def post(path: str, body: dict, timeout_s: float = 60) -> httpx.Response:
        return httpx.post(url + path, json=body, headers=entry.auth, timeout=timeout_s)

    def serving_index() -> int | None:
        state = entry.get("/state").json()
        mine = [i for i in state["instances"].values() if i["modelId"] == MODEL]
        if len(mine) != 1 or not all(state["runners"].get(s["runnerId"], {}).get("state") in ("Ready", "Running")
                                     for s in mine[0]["shards"]):
            return None
        node = mine[0]["shards"][0]["nodeId"]
        return ids.index(node) if node in ids else None

    def serves() -> bool:
        return post("/v1/chat/completions", {"model": MODEL, "messages": PROMPT, "max_tokens": 4}).status_code == 200

    wait_for(lambda: post("/place_instance", {"modelId": MODEL, "minNodes": 1, "excludedNodes": [ids[entry_index]]},
                          timeout_s=10).status_code == 200, timeout_s=60, interval_s=0.5, what="the placement")
    wait_for(lambda: serving_index() is not None, timeout_s=RECOVERY_DEADLINE_S, interval_s=0.5,
             what="the model Ready")

    ledger = Ledger()
    stop = threading.Event()

    began = time.monotonic()
    timeline: list[str] = []

    def client() -> None:
        while not stop.is_set():
            started = time.monotonic() - began
            outcome, detail = _one_request(url, headers=entry.auth)
            if outcome == "untyped":
                detail = f"{detail} (sent at {started:.1f}s, ended at {time.monotonic() - began:.1f}s)"
            ledger.record(outcome, detail)

    def index_monitor() -> None:
        last: dict[int, int] = {}
        while not stop.is_set():
            for i, node in enumerate(nodes):
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    idx = httpx.get(f"http://{star.addresses[i]}:{API_PORT}/v1/cluster", headers=node.auth,
                                    timeout=2).json()["lastEventIdx"]
                    if idx is not None and idx < last.get(i, -1):
                        with ledger.lock:
                            ledger.index_regressions.append(f"nc{i}: {last[i]} -> {idx}")
                    if idx is not None:
                        last[i] = max(idx, last.get(i, -1))
            stop.wait(0.5)

    threads = [threading.Thread(target=client, daemon=True, name=f"client-{i}") for i in range(CLIENTS)]
    threads.append(threading.Thread(target=index_monitor, daemon=True, name="index-monitor"))
    for thread in threads:
        thread.start()
    master_changes: list[str] = []
    cut: int | None = None
    try:
        for step, (kind, cut_s) in enumerate(schedule):
            wait_for(lambda: ledger.outcomes["completed"] > 0, timeout_s=60, interval_s=0.1,
                     what="a completed request before the cut")
            before = cluster(entry)
            master = ids.index(before["masterNodeId"])
            server = serving_index()
            idle = [i for i in others if i not in (master, server)]
            roles = {"cut-server": server, "cut-master": master, "cut-idle": idle[0] if idle else None}
            # A role on the entry node (the clients' way in) or on no node: cut another role.
            kind = next(k for k in (kind, "cut-idle", "cut-server", "cut-master") if roles[k] in others)
            victim = roles[kind]
            assert victim is not None
            if victim == master:
                kind = "cut-master"  # the server may be the master too
            cut = victim
            faulted_at = time.monotonic()
            star.cut(cut)
            timeline.append(f"{faulted_at - began:.1f}s cut nc{victim} ({kind})")
            time.sleep(cut_s)  # the cut's length is the fault itself, not a synchronisation
            star.heal(cut)
            timeline.append(f"{time.monotonic() - began:.1f}s healed nc{victim}")
            cut = None
            try:
                after = wait_for(lambda: agreed(nodes, members=3), timeout_s=RECOVERY_DEADLINE_S, interval_s=0.5,
                                 what="three members agreeing after the heal")
                wait_for(lambda: serving_index() is not None and serves(), timeout_s=RECOVERY_DEADLINE_S,
                         interval_s=0.5, what="the model serving again")
            except TimeoutError as exc:
                logs = "\n".join(f"--- nc{i}\n{n.log()[-2500:]}" for i, n in enumerate(nodes))
                raise AssertionError(f"step {step} {kind}: {exc}\n{logs}") from None
            changed = after["masterNodeId"] != before["masterNodeId"]
            if changed and kind != "cut-master":  # a cut master may be replaced by the majority
                master_changes.append(f"step {step} {kind} of nc{victim}: "
                                      f"{before['masterNodeId']} -> {after['masterNodeId']}")
            print(f"step {step}: {kind} (nc{victim}) {cut_s:g}s: recovered {time.monotonic() - faulted_at:.1f}s after the cut; "
                  f"master {'changed' if changed else 'unchanged'}")
    finally:
        if cut is not None:
            star.heal(cut)
        stop.set()
        for thread in threads:
            thread.join(timeout=CLIENT_TIMEOUT_S + 10)
    hung = [t.name for t in threads if t.is_alive()]
    try:  # the clients' last events may still be on their way to a follower: wait for them
        final = wait_for(lambda: agreed(nodes, members=3), timeout_s=RECOVERY_DEADLINE_S, interval_s=0.5,
                         what="three members agreeing after the clients stopped")
    except TimeoutError:
        final = None
    print(f"invariants (seed {SEED}):\n"
          f"  requests: {dict(ledger.outcomes)}; typed errors by code: {dict(ledger.typed)}; "
          f"untyped: {len(ledger.untyped)}; hung clients: {hung}\n"
          f"  index regressions: {ledger.index_regressions or 'none'}\n"
          f"  unexpected master changes: {master_changes or 'none'}\n"
          f"  stateHash agreed: {final['stateHash'] if final else 'NO'}\n"
          f"  model serves: {serves()}")
    print(f"  timeline: {timeline}")
    assert not hung, hung
    assert not ledger.untyped, (ledger.untyped[:5], timeline, entry.log()[-8000:])
    assert ledger.outcomes["completed"] > 0
    assert not ledger.index_regressions, ledger.index_regressions
    assert not master_changes, master_changes
    assert final is not None, [cluster(n) for n in nodes]
    assert serves()
