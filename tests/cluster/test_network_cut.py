"""A node cut off by the network (not paused: it keeps running) returns without deposing the
master. Three real nodes, each in its own network namespace on one bridge (`tests.netns.Star`);
the cut unplugs one node's cable. The majority keeps its master and keeps serving (streams run
back to back through the master, on an instance of the third node) while the cut node
campaigns alone; when the cable is plugged back in, the cut node adopts the current master:
same master, same session, no stream fails.

Before: the cut node led a session of its own at a higher election clock, and on healing
that clock won, deposing the healthy master and failing every stream in the cluster.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

import pytest

from tests.cluster.harness import agreed, cluster, node_id, wait_agreed
from tests.netns import Star, curl_from, three_namespaces  # noqa: F401 - fixture
from tests.nodeproc import NodeProcess, wait_for

pytestmark = pytest.mark.timeout(300)

MODEL = "local/tiny-llama-gguf"
ZENOH_PORT = 7447
API_PORT = 52415
CUT_S = 12.0
"""Long past the 2 s transport lease (both sides lose each other's presence, the master prunes
the cut node) and the cut node's first campaign window: without the member majority it would
lead alone by then. Also past the worst case of the cut node's own zenoh stalling (its peers'
tokens stay, so it is deaf and starts no campaign): deaf after 5 s, kicked 2 s later, then
the lease ends and it campaigns (routing/hearing.py); seen once with an 8 s cut."""
STREAM_TOKENS = 128


def _start(spawn_node, star: Star) -> list[NodeProcess]:
    first = f"tcp/{star.addresses[0]}:{ZENOH_PORT}"
    nodes = []
    for i, (ns, address) in enumerate(zip(star.names, star.addresses, strict=True)):
        args = ["--listen", f"tcp/{address}:{ZENOH_PORT}", "--cluster-key", "cut-key", "--node-name", f"cut{i}"]
        if i:
            args += ["--bootstrap-peers", first]
        nodes.append(spawn_node(f"cut{i}", netns=ns, api_host=address, port=API_PORT, extra_args=args))
    for node in nodes:
        node.wait_ready()
    return nodes


def _post(node: NodeProcess, path: str, body: dict, timeout_s: float = 30) -> tuple[int, str]:
    assert node.netns is not None
    return curl_from(node.netns, node.url + path, method="POST", headers=node.auth, body=json.dumps(body),
                     timeout_s=timeout_s)


def _stream_to_end(api: NodeProcess) -> tuple[int, str | None]:
    """One streamed chat through `api`: (chunks, finish reason); raises on an error event."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "the the the"}], "max_tokens": STREAM_TOKENS,
            "temperature": 0, "stream": True}
    status, text = _post(api, "/v1/chat/completions", body, timeout_s=60)
    assert status == 200, (status, text[-2000:])
    chunks, finish = 0, None
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: "):])
        assert "error" not in event, f"a stream on the majority failed: {event}"
        chunks += 1
        finish = event["choices"][0].get("finish_reason") or finish
    return chunks, finish


def _ready(node: NodeProcess, instance_id: str) -> bool:
    state = node.get("/state").json()
    instance = state["instances"].get(instance_id)
    return instance is not None and all(
        state["runners"].get(s["runnerId"], {}).get("state") == "Ready" for s in instance["shards"]
    )


def _phase(node: NodeProcess) -> str | None:
    response = node.get("/v1/diagnostics/node")
    return response.json()["election"]["phase"] if response.status_code == 200 else None


def test_a_cut_node_keeps_campaigning_and_rejoins_the_master_when_the_link_heals(spawn_node, three_namespaces) -> None:
    star: Star = three_namespaces
    nodes = _start(spawn_node, star)
    wait_agreed(nodes, members=3, timeout_s=60)
    ids = [node_id(n) for n in nodes]
    before = cluster(nodes[0])
    master_index = ids.index(before["masterNodeId"])
    cut_index, server_index = [i for i in range(3) if i != master_index]
    master, cut_node = nodes[master_index], nodes[cut_index]

    def placed() -> dict | None:
        body = {"modelId": MODEL, "minNodes": 1, "excludedNodes": [ids[master_index], ids[cut_index]]}
        status, text = _post(master, "/place_instance", body)
        return json.loads(text)["preview"] if status == 200 else None

    preview = wait_for(placed, timeout_s=90, interval_s=0.5, what="a placement on the serving node")
    assert preview["shards"][0]["nodeId"] == ids[server_index]
    wait_for(lambda: _ready(master, preview["instanceId"]), timeout_s=120, interval_s=0.5, what="the model Ready")

    results: list[tuple[int, str | None]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def keep_streaming() -> None:
        while not stop.is_set():
            try:
                results.append(_stream_to_end(master))
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
                time.sleep(0.5)

    streamer = threading.Thread(target=keep_streaming, name="streams", daemon=True)
    streamer.start()
    phases: list[str | None] = []
    server_kept_during_cut = False
    try:
        wait_for(lambda: results or errors, timeout_s=60, interval_s=0.1, what="a first stream")
        star.cut(cut_index)
        cut_at = time.monotonic()
        wait_for(lambda: ids[cut_index] not in master.get("/state").json()["nodes"], timeout_s=30, interval_s=0.25,
                 what="the cut node pruned by the majority's master")
        streams_before_heal = len(results)
        while time.monotonic() - cut_at < CUT_S:  # the cut's length is the fault under test
            phases.append(_phase(cut_node))
            time.sleep(0.5)
        during = cluster(master)
        server_kept_during_cut = ids[server_index] in master.get("/state").json()["nodes"]
        star.heal(cut_index)
        after = wait_agreed(nodes, members=3, timeout_s=60, what="the cut node back in the cluster")
        wait_for(lambda: len(results) > streams_before_heal + 1, timeout_s=60, interval_s=0.25,
                 what="streams across the heal")
    finally:
        stop.set()
        with contextlib.suppress(AssertionError):
            star.heal(cut_index)
    streamer.join(timeout=90)
    assert not streamer.is_alive(), "the streaming client hung"
    # The serving node is untouched by the cut: it is never pruned, and no stream fails typed.
    # (It once was, now and then: zenoh's traffic from the master to it stalled while the cut
    # node's link was down, so its presence challenges failed; its sealed messages, which kept
    # arriving, now keep it, see routing/presence.py.)
    assert server_kept_during_cut, f"the serving node {ids[server_index]} was pruned during the cut"
    assert (during["masterNodeId"], during["sessionId"]) == (before["masterNodeId"], before["sessionId"])
    assert "leading" not in phases, phases  # the cut node never led a session of its own
    assert "campaigning" in phases, phases  # it did notice the cut
    for role, index in (("serving node", server_index), ("master", master_index)):
        # Deafness (routing/hearing.py): a node that heard none of its present peers for 5 s.
        # A stall of the master's traffic makes the serving node deaf: it then decides no
        # election and kicks zenoh's threads; printed (before the checks below) so a run shows it.
        response = nodes[index].get("/v1/diagnostics/node")
        if response.status_code == 200:
            print(f"\n{role} {ids[index]} hearing: {response.json()['transport'].get('hearing')}")
    # Issue 18: now and then zenoh's delivery from the master to the serving node stalled for
    # the whole cut (a missed wake-up inside zenoh; bytes unread in the socket while its threads
    # slept), so a stream started then got no first frame, and the serving node, hearing no
    # master, could campaign with the healed node. The kick (routing/kick.py) ends that stall;
    # a deaf node decides no campaign (routing/hearing.py). Both symptoms now fail the test.
    assert not errors, f"a stream on the majority failed or stalled during the cut: {errors}"
    assert (after["masterNodeId"], after["sessionId"]) == (before["masterNodeId"], before["sessionId"]), \
        f"a new session after the heal: {before['sessionId']} -> {after['sessionId']}"
    assert results and all(chunks > 0 and finish is not None for chunks, finish in results), results
    assert agreed(nodes, members=3) is not None or wait_agreed(nodes, members=3)
    print(f"\n{len(results)} streams completed across a {CUT_S:.0f}s cut of {ids[cut_index]} and its heal; "
          f"master {after['masterNodeId']} session {after['sessionId']} after the heal; cut node phases {set(phases)}")
