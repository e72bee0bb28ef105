"""A node returning from a pause (SIGSTOP for longer than its presence survives, then SIGCONT)
rejoins the current master: the master and its session are unchanged, and streams served by
untouched nodes run to their end while it returns. Real node processes on loopback.

Before: the returning node campaigned at a higher clock, the healthy master stepped down and
re-elected itself in a new session, and every open stream in the cluster failed.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time

import httpx
import pytest

from tests.cluster.harness import cluster, node_id, start_linked, wait_agreed
from tests.nodeproc import NodeProcess, wait_for

pytestmark = pytest.mark.timeout(300)

MODEL = "local/tiny-llama-gguf"
PROMPT = [{"role": "user", "content": "the the the the"}]
PAUSE_S = 8.0
"""Long past the 2 s transport lease (the master prunes the paused node) and the 6 s leader
silence (the node campaigns as soon as it runs again)."""
AFTER_RETURN_S = 6.0
"""How long streams keep running after SIGCONT: the returning node's campaign and rejoin
happen within this window."""


STREAM_TOKENS = 256
"""Tokens per streamed chat: streams run back to back across the return, so each is short."""


def _ready(node: NodeProcess, instance_id: str) -> bool:
    state = node.get("/state").json()
    instance = state["instances"].get(instance_id)
    return instance is not None and all(
        state["runners"].get(s["runnerId"], {}).get("state") == "Ready" for s in instance["shards"]
    )


def _stream_to_end(api: NodeProcess) -> tuple[int, str | None]:
    """One long streamed chat: (chunks, finish reason); raises on an error event."""
    chunks, finish = 0, None
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": STREAM_TOKENS, "temperature": 0, "stream": True}
    with httpx.stream("POST", api.url + "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            assert "error" not in event, f"a stream on an untouched node failed: {event}"
            chunks += 1
            finish = event["choices"][0].get("finish_reason") or finish
    return chunks, finish


def test_a_paused_node_returns_without_deposing_the_master_or_failing_other_streams(spawn_node) -> None:
    nodes = start_linked(spawn_node, ["ret-a", "ret-b", "ret-c"])
    wait_agreed(nodes, members=3)
    ids = {node_id(n): n for n in nodes}
    before = cluster(nodes[0])
    master_id = before["masterNodeId"]
    master = ids[master_id]
    others = [n for n in ids if n != master_id]
    _server_id, paused_id = others
    paused = ids[paused_id]

    def placed() -> dict | None:
        body = {"modelId": MODEL, "minNodes": 1, "excludedNodes": [master_id, paused_id]}
        response = httpx.post(master.url + "/place_instance", json=body, timeout=10)
        return response.json()["preview"] if response.status_code == 200 else None

    preview = wait_for(placed, timeout_s=90, interval_s=0.5, what="a placement on the serving node")
    wait_for(lambda: _ready(master, preview["instanceId"]), timeout_s=120, interval_s=0.5, what="the model Ready")

    results: list[tuple[int, str | None]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def keep_streaming() -> None:
        try:
            while not stop.is_set():
                results.append(_stream_to_end(master))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    paused.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: paused_id not in master.get("/state").json()["nodes"], timeout_s=30, interval_s=0.25,
                 what="the paused node pruned on presence loss")
        streamer = threading.Thread(target=keep_streaming, name="streams", daemon=True)
        streamer.start()
        started = time.monotonic()
        wait_for(lambda: results or errors, timeout_s=90, interval_s=0.1, what="a first stream")
        print(f"\nfirst {STREAM_TOKENS}-token stream took {time.monotonic() - started:.2f}s")
        time.sleep(max(0.0, PAUSE_S - 3.0))  # the pause itself is the fault under test, not a sync
        paused.signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        wait_for(lambda: time.monotonic() - resumed_at >= AFTER_RETURN_S or errors, timeout_s=AFTER_RETURN_S + 5,
                 interval_s=0.25, what="streams across the return")
        stop.set()
        streamer.join(timeout=90)
        assert not streamer.is_alive(), "the streaming client hung"
    finally:
        with contextlib.suppress(ProcessLookupError):
            paused.signal(signal.SIGCONT)
        stop.set()
    assert not errors, errors[0]
    assert results and all(chunks > 0 and finish is not None for chunks, finish in results), results
    after = wait_agreed(nodes, members=3, what="the returned node back in the cluster")
    assert (after["masterNodeId"], after["sessionId"]) == (master_id, before["sessionId"])
    print(f"\n{len(results)} streams completed across the pause and return of {paused_id}; "
          f"master {master_id} session {after['sessionId']} unchanged")
